package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
)

func testKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func openTestStore(t testing.TB, lim Limits) *Store {
	t.Helper()
	s, err := OpenStore(t.TempDir(), testKey(t), lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func appendN(t testing.TB, s *Store, id string, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.Append("acme", api.SandboxEvent{SandboxID: id, Type: api.EventRunStarted, RunID: fmt.Sprintf("run_%d", i),
			Run: &api.RunEvent{Command: fmt.Sprintf("echo %d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
}

func verify(t *testing.T, s *Store, id string) api.AuditVerifyResult {
	t.Helper()
	res, err := s.Verify(id)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func logLines(t *testing.T, s *Store, id string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dir, id, "log.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(b, []byte("\n"))[:bytes.Count(b, []byte("\n"))]
}

func writeLines(t *testing.T, s *Store, id string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.dir, id, "log.jsonl"), bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestChainVerifies(t *testing.T) {
	s := openTestStore(t, Limits{SignEvery: 4})
	appendN(t, s, "sb1", 10)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	res := verify(t, s, "sb1")
	if !res.OK || res.Events != 10 || res.Signed != 10 || res.Problem != "" {
		t.Fatalf("intact record: %+v", res)
	}
}

// Every kind of tampering with the stored file is detected: an edited
// byte of an event, a record deleted, two records swapped, the tail cut
// off after a signed head, the heads file removed or forged, and a
// record recomputed with a valid hash but without the key.
func TestVerifyDetectsTampering(t *testing.T) {
	for name, tamper := range map[string]func(t *testing.T, s *Store, lines [][]byte){
		"edit": func(t *testing.T, s *Store, lines [][]byte) {
			lines[4] = bytes.Replace(lines[4], []byte("echo 4"), []byte("echo 5"), 1)
			writeLines(t, s, "sb1", lines)
		},
		"delete": func(t *testing.T, s *Store, lines [][]byte) {
			writeLines(t, s, "sb1", append(lines[:3:3], lines[4:]...))
		},
		"reorder": func(t *testing.T, s *Store, lines [][]byte) {
			lines[2], lines[3] = lines[3], lines[2]
			writeLines(t, s, "sb1", lines)
		},
		"truncate": func(t *testing.T, s *Store, lines [][]byte) {
			writeLines(t, s, "sb1", lines[:7])
		},
		"delete first": func(t *testing.T, s *Store, lines [][]byte) {
			writeLines(t, s, "sb1", lines[1:])
		},
		"heads removed": func(t *testing.T, s *Store, _ [][]byte) {
			if err := os.Remove(filepath.Join(s.dir, "sb1", "heads.jsonl")); err != nil {
				t.Fatal(err)
			}
		},
		"head forged": func(t *testing.T, s *Store, _ [][]byte) {
			// Signed with another key.
			h := signHead(testKey(t), "sb1", 3, strings.Repeat("0", 64), time.Now())
			b := fmt.Appendf(nil, `{"seq":%d,"hash":%q,"time":%q,"sig":%q}`+"\n", h.Seq, h.Hash, h.Time.Format(time.RFC3339Nano), h.Sig)
			f, err := os.OpenFile(filepath.Join(s.dir, "sb1", "heads.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(b)
			f.Close()
		},
		"rechained": func(t *testing.T, s *Store, lines [][]byte) {
			// An attacker without the key edits record 9 and recomputes
			// its hash and record 10's: the signed head of 10 catches it.
			var out [][]byte
			prev := zeroHash
			for i, l := range lines {
				r, err := decodeRecord(bytes.TrimSuffix(l, []byte("\n")))
				if err != nil {
					t.Fatal(err)
				}
				ev := r.Event
				if i == 8 {
					ev = bytes.Replace(ev, []byte("echo 8"), []byte("rm -rf"), 1)
				}
				line, h := encodeRecord("sb1", r.Seq, prev, ev)
				out, prev = append(out, line), h
			}
			writeLines(t, s, "sb1", out)
		},
		"garbage line": func(t *testing.T, s *Store, lines [][]byte) {
			lines[5] = []byte("{not json\n")
			writeLines(t, s, "sb1", lines)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := openTestStore(t, Limits{SignEvery: 5})
			appendN(t, s, "sb1", 10)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			tamper(t, s, logLines(t, s, "sb1"))
			res := verify(t, s, "sb1")
			if res.OK || res.Problem == "" {
				t.Fatalf("tampering (%s) not detected: %+v", name, res)
			}
			t.Logf("%s: %s", name, res.Problem)
		})
	}
}

// A record copied from another sandbox does not verify: the id is in
// every hash.
func TestVerifyBindsTheSandbox(t *testing.T) {
	s := openTestStore(t, Limits{})
	appendN(t, s, "sb1", 3)
	appendN(t, s, "sb2", 3)
	s.Flush()
	writeLines(t, s, "sb2", logLines(t, s, "sb1"))
	if res := verify(t, s, "sb2"); res.OK {
		t.Fatalf("sb1's records verify as sb2's: %+v", res)
	}
}

// A chatty sandbox is bounded: events beyond the bound are dropped and
// reported by one "dropped" record, and the record still verifies.
func TestBoundsDropWithARecord(t *testing.T) {
	s := openTestStore(t, Limits{MaxEvents: 5})
	appendN(t, s, "sb1", 20)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	res := verify(t, s, "sb1")
	if !res.OK || res.Events != 6 {
		t.Fatalf("bounded record: %+v, want 5 events and a dropped record", res)
	}
	var dropped *api.DroppedEvents
	if _, err := s.scan("sb1", 0, func(r record) error {
		ev, err := decodeEvent(r)
		if ev.Type == api.EventDropped {
			dropped = ev.Dropped
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if dropped == nil || dropped.Count != 15 {
		t.Fatalf("dropped record: %+v, want 15", dropped)
	}

	// By bytes too.
	s2 := openTestStore(t, Limits{MaxBytes: 2 * dropReserve})
	appendN(t, s2, "sb1", 2000)
	s2.Flush()
	fi, err := os.Stat(filepath.Join(s2.dir, "sb1", "log.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 2*dropReserve {
		t.Fatalf("record grew to %d bytes, bound %d", fi.Size(), 2*dropReserve)
	}
	if res := verify(t, s2, "sb1"); !res.OK {
		t.Fatalf("bounded record: %+v", res)
	}
}

// A reopened store continues the chain; a torn last line (a crash
// mid-write) is cut off.
func TestReopenContinuesTheChain(t *testing.T) {
	dir, key := t.TempDir(), testKey(t)
	s, err := OpenStore(dir, key, Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, "sb1", 3)
	s.Close()
	f, err := os.OpenFile(filepath.Join(dir, "sb1", "log.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"seq":4,"prev":"`)
	f.Close()
	s, err = OpenStore(dir, key, Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	appendN(t, s, "sb1", 2)
	s.Flush()
	if res := verify(t, s, "sb1"); !res.OK || res.Events != 5 {
		t.Fatalf("reopened record: %+v", res)
	}
}

// A deleted sandbox's record is kept for the retention period, then
// removed; nothing more is appended to it.
func TestFinishAndRetention(t *testing.T) {
	s := openTestStore(t, Limits{Retention: time.Hour})
	appendN(t, s, "sb1", 2)
	if err := s.Finish("sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append("acme", api.SandboxEvent{SandboxID: "sb1", Type: api.EventCreate}); err == nil {
		t.Fatal("appended to a finished record")
	}
	info, err := s.Info("sb1")
	if err != nil || !info.Deleted || info.Owner != "acme" {
		t.Fatalf("info %+v, %v", info, err)
	}
	if res := verify(t, s, "sb1"); !res.OK || !res.Deleted {
		t.Fatalf("finished record: %+v", res)
	}
	if n, err := s.Sweep(time.Now()); err != nil || n != 0 {
		t.Fatalf("swept %d (%v) inside the retention", n, err)
	}
	if n, err := s.Sweep(time.Now().Add(2 * time.Hour)); err != nil || n != 1 {
		t.Fatalf("swept %d (%v) after the retention", n, err)
	}
	if _, err := s.Info("sb1"); err == nil {
		t.Fatal("record kept after its retention")
	}
}

func TestSandboxIDsArePaths(t *testing.T) {
	s := openTestStore(t, Limits{})
	for _, id := range []string{"", ".", "..", "../x", "a/b", ".hidden"} {
		if _, err := s.Append("", api.SandboxEvent{SandboxID: id}); err == nil {
			t.Errorf("sandbox id %q accepted", id)
		}
	}
}

func TestKeyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys", "audit.key")
	k1, err := LoadOrCreateKey(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v", fi.Mode(), err)
	}
	k2, err := LoadOrCreateKey(p)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("reloaded key differs (%v)", err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(p); err == nil {
		t.Fatal("a world-readable key file was accepted")
	}
}

func FuzzDecodeRecord(f *testing.F) {
	line, _ := encodeRecord("sb1", 1, zeroHash, []byte(`{"seq":1,"sandbox_id":"sb1","type":"create"}`))
	f.Add(bytes.TrimSuffix(line, []byte("\n")))
	f.Add([]byte(`{"seq":1}`))
	f.Add([]byte(`{"seq":1,"prev":"","hash":"","event":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			return
		}
		if !validHash(r.Prev) || !validHash(r.Hash) || len(r.Event) == 0 || r.Event[0] != '{' {
			t.Fatalf("accepted a malformed record: %q", b)
		}
		// What decodes re-encodes to a line that decodes the same.
		line, _ := encodeRecord("x", r.Seq, r.Prev, r.Event)
		r2, err := decodeRecord(bytes.TrimSuffix(line, []byte("\n")))
		if err != nil || r2.Seq != r.Seq || !bytes.Equal(r2.Event, r.Event) {
			t.Fatalf("re-encoded record differs: %v", err)
		}
		_, _ = decodeEvent(r)
	})
}

// Verifying a record while it grows reports no false problem.
func TestVerifyWhileAppending(t *testing.T) {
	s := openTestStore(t, Limits{SignEvery: 7})
	done := make(chan struct{})
	go func() {
		defer close(done)
		appendN(t, s, "sb1", 3000)
	}()
	for {
		select {
		case <-done:
			if res := verify(t, s, "sb1"); !res.OK || res.Events != 3000 {
				t.Fatalf("final: %+v", res)
			}
			return
		default:
		}
		if _, err := s.Info("sb1"); err != nil {
			continue
		}
		if res := verify(t, s, "sb1"); !res.OK {
			t.Fatalf("while appending: %+v", res)
		}
	}
}
