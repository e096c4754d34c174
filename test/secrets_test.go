package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/secrets"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// secretDaemon starts a daemon whose secrets key lives in a temp dir outside
// its data dir (and, with connectors, a connectors file); it returns the
// key file's path.
func secretDaemon(t *testing.T, connectors []map[string]string) (*daemon, string) {
	t.Helper()
	keyDir := t.TempDir()
	keyFile := filepath.Join(keyDir, "secrets.key")
	t.Setenv("AGENTBOX_SECRETS_KEY_FILE", keyFile)
	if connectors != nil {
		b, _ := json.Marshal(connectors)
		cf := filepath.Join(keyDir, "connectors.json")
		if err := os.WriteFile(cf, b, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AGENTBOX_CONNECTORS_FILE", cf)
	}
	return newDaemon(t), keyFile
}

// rot13 hides a value from the daemon's redactor (which knows the raw and
// encoded forms), so a leak inside the sandbox is visible in test output.
func rot13(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return 'a' + (r-'a'+13)%26
		case r >= 'A' && r <= 'Z':
			return 'A' + (r-'A'+13)%26
		}
		return r
	}, s)
}

const rot13Cmd = "tr 'A-Za-z' 'N-ZA-Mn-za-m'"

func TestSecretExecEnvOnlyAndRedacted(t *testing.T) {
	d, keyFile := secretDaemon(t, nil)
	ctx := context.Background()
	value := "sv" + randHex(16) + "Zq"
	if _, err := d.client.SetSecret(ctx, "api", []byte(value)); err != nil {
		t.Fatal(err)
	}
	list, err := d.client.Secrets(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "api" {
		t.Fatalf("Secrets = %+v, %v", list, err)
	}
	sb := d.create(t, agentbox.SandboxSpec{})

	// A process started before, without the secret.
	before, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 120"})
	if err != nil {
		t.Fatal(err)
	}
	// The secret reaches the process that asked for it (checked by hash:
	// nothing is printed).
	got := mustRun(t, sb, `printf %s "$API_KEY" | sha256sum | cut -d' ' -f1`, agentbox.WithSecret("api", "API_KEY"))
	if want := sha256hex(value); strings.TrimSpace(got) != want {
		t.Fatalf("process did not get the secret: hash %q, want %q", got, want)
	}
	// Echoed, it is redacted, also split across output chunks, on stderr
	// and base64-encoded.
	out := mustRun(t, sb, `echo "x $TOK y"; v=$TOK; printf %s "$(echo $v | cut -c1-7)"; sleep 0.3; echo "$(echo $v | cut -c8-)"; echo "$TOK" >&2; printf %s "$TOK" | base64`,
		agentbox.WithSecret("api", "TOK"))
	if strings.Contains(out, value) || strings.Count(out, "[REDACTED:api]") != 3 {
		t.Fatalf("stdout not redacted:\n%s", out)
	}
	res := run(t, sb, `echo "$TOK" >&2`, agentbox.WithSecret("api", "TOK"))
	if strings.Contains(string(res.Stderr), value) || !strings.Contains(string(res.Stderr), "[REDACTED:api]") {
		t.Fatalf("stderr not redacted: %q", res.Stderr)
	}

	// A long-running process holding the secret: it runs private, so the
	// environ scan below (from another exec) finds it nowhere, the holder
	// included (TestAdversarialExecSecretEnv shows the scan would read an
	// ordinary process's environment).
	holder, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 120", Secrets: []api.ExecSecret{{Name: "api"}}})
	if err != nil {
		t.Fatal(err)
	}
	scan := mustRun(t, sb, `for f in /proc/[0-9]*/environ; do p=${f#/proc/}; p=${p%/environ}; tr '\0' '\n' < $f 2>/dev/null | `+rot13Cmd+` | sed "s|^|$p |"; done`)
	leaked := map[string]bool{}
	for _, line := range strings.Split(scan, "\n") {
		if pid, rest, ok := strings.Cut(line, " "); ok && strings.Contains(rest, rot13(value)) {
			leaked[pid] = true
		}
	}
	if len(leaked) != 0 {
		t.Fatalf("secret readable in the environment of pids %v from another exec; want none (holder %d is private, guest pid 1 and earlier process %d must not have it)", leaked, holder.Pid(), before.Pid())
	}
	if res := run(t, sb, fmt.Sprintf("cat /proc/%d/environ", holder.Pid())); res.ExitCode == 0 {
		t.Fatalf("another exec read the holder's environment")
	}
	// The process listing never carries environments.
	procs, err := sb.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(procs); bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte(`"env"`)) {
		t.Fatalf("process list shows the environment: %s", b)
	}

	// Filesystem scan inside (the sandbox's own filesystem; /proc, /sys and
	// /dev are other mounts), with a planted copy as positive control.
	mustRun(t, sb, `printf %s "$S" > /root/planted`, agentbox.WithSecret("api", "S"))
	found := mustRun(t, sb, `v=$(echo `+rot13(value)+` | `+rot13Cmd+`); find / -xdev -type f -exec grep -lF "$v" {} + 2>/dev/null; true`)
	if strings.TrimSpace(found) != "/root/planted" {
		t.Fatalf("filesystem scan found %q, want only /root/planted", found)
	}
	mustRun(t, sb, `rm /root/planted`)

	// Host side: nothing under the data dir (store, metadata, sandbox
	// layers) or in the daemon log holds the value; the key is outside.
	forms := map[string][]byte{"raw": []byte(value), "base64": []byte(base64.StdEncoding.EncodeToString([]byte(value)))}
	err = filepath.WalkDir(d.dataDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		for form := range fileHolds(p, forms) {
			t.Errorf("host file %s holds the secret (%s)", p, form)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(keyFile, d.dataDir) {
		t.Fatalf("key file %s inside the data dir", keyFile)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	if len(fileHolds(d.logPath, forms)) > 0 {
		t.Fatal("daemon log holds the secret")
	}
	// Attaching later (replay) is redacted too.
	echoer, err := sb.Start(ctx, api.ExecRequest{Command: `echo "late $K"`, Secrets: []api.ExecSecret{{Name: "api", Env: "K"}}})
	if err != nil {
		t.Fatal(err)
	}
	ares, err := echoer.Attach(ctx, true, agentbox.Streams{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(ares.Stdout), value) || !strings.Contains(string(ares.Stdout), "late [REDACTED:api]") {
		t.Fatalf("attach replay: %q", ares.Stdout)
	}
	// Unknown secret: a clear 404, no process.
	if _, err := sb.Run(ctx, "true", agentbox.WithSecret("nope", "")); !agentbox.IsNotFound(err) {
		t.Fatalf("unknown secret: %v", err)
	}
	if err := d.client.DeleteSecret(ctx, "api"); err != nil {
		t.Fatal(err)
	}
}

func sha256hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// bridgeRequest is a shell command sending one HTTP/1.0 request with the
// token in $T to the bridge inside the sandbox, printing the response.
func bridgeRequest(method, path, body string) string {
	return fmt.Sprintf(`printf '%s %s HTTP/1.0\r\nAuthorization: Bearer %%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' "$T" | nc 127.0.0.1 3129`,
		method, path, len(body), body)
}

func status(resp string) string {
	line, _, _ := strings.Cut(resp, "\r\n")
	if f := strings.Fields(line); len(f) >= 2 {
		return f[1]
	}
	return "none:" + resp
}

func TestBridge(t *testing.T) {
	cred := "upcred" + randHex(12)
	var (
		mu   sync.Mutex
		seen []string
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		// A careless upstream echoing the credential.
		fmt.Fprintf(w, "ok %s auth=%s\n", r.URL.Path, r.Header.Get("Authorization"))
	}))
	defer up.Close()
	d, keyFile := secretDaemon(t, []map[string]string{{"name": "up", "url": up.URL, "secret": "upstream"}})
	ctx := context.Background()
	if _, err := d.client.SetSecret(ctx, "upstream", []byte(cred)); err != nil {
		t.Fatal(err)
	}
	a := d.create(t, agentbox.SandboxSpec{})
	b := d.create(t, agentbox.SandboxSpec{})
	upCalls := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }

	// A valid token reaches the connector, which gets the real credential;
	// the echo is scrubbed before it reaches the sandbox.
	out := mustRun(t, a, `T=$`+api.RunTokenEnv+`; `+bridgeRequest("POST", "/v1/connectors/up/hello", "{}"), agentbox.WithRunToken())
	if status(out) != "200" || strings.Contains(out, cred) || !strings.Contains(out, "auth=Bearer [REDACTED:upstream]") {
		mu.Lock()
		t.Fatalf("valid request: %q (upstream saw %q)", out, seen)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "POST /hello Bearer "+cred {
		t.Fatalf("upstream saw %q", seen)
	}
	mu.Unlock()
	// Events from inside land in the daemon's records.
	out = mustRun(t, a, `T=$`+api.RunTokenEnv+`; `+bridgeRequest("POST", "/v1/events", `{"type":"metric","name":"tokens","value":12}`), agentbox.WithRunToken())
	if status(out) != "202" {
		t.Fatalf("event: %q", out)
	}
	evs, err := a.QueryEvents(ctx, agentbox.EventQuery{Types: []string{api.SandboxEventMetric}})
	if err != nil || len(evs) != 1 || evs[0].Name != "tokens" || evs[0].Value != 12 || evs[0].SandboxID != a.ID() || evs[0].RunID == "" {
		t.Fatalf("events %+v, %v", evs, err)
	}
	// The flight recorder links it to the run that sent it.
	if runs, err := a.QueryEvents(ctx, agentbox.EventQuery{Types: []string{api.EventRunStarted}, Run: evs[0].RunID}); err != nil || len(runs) != 1 {
		t.Fatalf("the bridge event's run %s: %+v, %v", evs[0].RunID, runs, err)
	}

	// A live run in A holding a token.
	live, err := a.Start(ctx, api.ExecRequest{Command: `echo "$` + api.RunTokenEnv + `" > /root/tok; sleep 120`, Token: true})
	if err != nil {
		t.Fatal(err)
	}
	var tokA string
	for i := 0; i < 100 && tokA == ""; i++ {
		if b, err := a.ReadFile(ctx, "/root/tok"); err == nil {
			tokA = strings.TrimSpace(string(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if tokA == "" {
		t.Fatal("no token")
	}
	use := func(sb *agentbox.Sandbox, tok string) string {
		t.Helper()
		return status(mustRun(t, sb, bridgeRequest("POST", "/v1/connectors/up/x", ""), agentbox.WithEnv(map[string]string{"T": tok})))
	}
	if s := use(a, tokA); s != "200" {
		t.Fatalf("live token from its own sandbox: %s", s)
	}
	calls := upCalls()

	// Forged and misused tokens, each next to a control that passes.
	key, err := secrets.LoadOrCreateKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var claims secrets.RunClaims
	if _, _, err := jwt.NewParser().ParseUnverified(tokA, &claims); err != nil {
		t.Fatal(err)
	}
	sign := func(c secrets.RunClaims, alg jwt.SigningMethod, k any) string {
		s, err := jwt.NewWithClaims(alg, c).SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hsKey := key.Derive("agentbox run tokens v1 HS256")
	if s := use(a, sign(claims, jwt.SigningMethodHS256, hsKey)); s != "200" {
		t.Fatalf("control: re-signed valid claims: %s", s)
	}
	wrongAud, expired := claims, claims
	wrongAud.Audience = jwt.ClaimStrings{"agentbox-api"}
	expired.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Minute))
	parts := strings.Split(tokA, ".")
	noneTok := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	for name, tc := range map[string]struct {
		sb  *agentbox.Sandbox
		tok string
	}{
		"token of A from B":   {b, tokA},
		"alg none":            {a, noneTok},
		"alg none (library)":  {a, sign(claims, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType)},
		"other audience":      {a, sign(wrongAud, jwt.SigningMethodHS256, hsKey)},
		"expired":             {a, sign(expired, jwt.SigningMethodHS256, hsKey)},
		"HS512":               {a, sign(claims, jwt.SigningMethodHS512, hsKey)},
		"signed by other key": {a, sign(claims, jwt.SigningMethodHS256, []byte("0123456789abcdef0123456789abcdef"))},
		"no token":            {a, ""},
	} {
		if s := use(tc.sb, tc.tok); s != "401" {
			t.Errorf("%s: status %s, want 401", name, s)
		}
	}

	// After the run ends the token is dead, even from its own sandbox.
	if err := live.Signal(ctx, "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Attach(ctx, false, agentbox.Streams{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for use(a, tokA) != "401" {
		if time.Now().After(deadline) {
			t.Fatal("token still accepted after its run ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A foreground run's token is dead as soon as its exit is delivered.
	fg := strings.TrimSpace(mustRun(t, a, `echo "$`+api.RunTokenEnv+`"`, agentbox.WithRunToken()))
	if s := use(a, fg); s != "401" {
		t.Fatalf("token of a finished run: %s", s)
	}
	if n := upCalls(); n != calls+1 { // only the re-signed control got through
		t.Fatalf("rejected requests reached the upstream: %d calls, want %d", n, calls+1)
	}

	// From the host network there is nothing to reach.
	if c, err := net.DialTimeout("tcp", api.BridgeAddr, time.Second); err == nil {
		c.Close()
		t.Fatalf("something listens on the host at %s", api.BridgeAddr)
	}
	// The connector's credential is nowhere inside.
	found := mustRun(t, a, `v=$(echo `+rot13(cred)+` | `+rot13Cmd+`); find / -xdev -type f -exec grep -lF "$v" {} + 2>/dev/null; for f in /proc/[0-9]*/environ; do grep -lF "$v" $f 2>/dev/null; done; true`)
	if strings.TrimSpace(found) != "" {
		t.Fatalf("connector credential found inside: %q", found)
	}
}

// Forks and restores never inherit a usable token: a token left on disk is
// copied into the fork and survives in the restored filesystem, but is
// refused in both, while the run that minted it is still live.
func TestBridgeTokenNotInheritedByForkOrRestore(t *testing.T) {
	d, _ := secretDaemon(t, []map[string]string{{"name": "up", "url": "http://127.0.0.1:9", "secret": "upstream"}})
	ctx := context.Background()
	a := d.create(t, agentbox.SandboxSpec{})
	if _, err := a.Start(ctx, api.ExecRequest{Command: `echo "$` + api.RunTokenEnv + `" > /root/tok; sleep 120`, Token: true}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if b, err := a.ReadFile(ctx, "/root/tok"); err == nil && len(b) > 10 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Events need no connector: 202 proves the token works, 401 that not.
	useFileToken := func(sb *agentbox.Sandbox) string {
		t.Helper()
		// The bridge listener comes up with the sandbox's tunnel, which a
		// new or restarted guest opens asynchronously: retry a refused
		// connection briefly.
		cmd := `T=$(cat /root/tok); for i in $(seq 50); do out=$(` + bridgeRequest("POST", "/v1/events", `{"type":"log","message":"x"}`) + ` 2>/dev/null) && [ -n "$out" ] && break; sleep 0.05; done; printf %s "$out"`
		return status(mustRun(t, sb, cmd))
	}
	if s := useFileToken(a); s != "202" {
		t.Fatalf("control: live token in its sandbox: %s", s)
	}
	ck, err := a.Checkpoint(ctx, "withtok")
	if err != nil {
		t.Fatal(err)
	}
	forks, err := a.Fork(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = forks[0].Delete(context.Background()) })
	if s := useFileToken(forks[0]); s != "401" {
		t.Fatalf("token used in a fork: %s, want 401", s)
	}
	if _, err := a.Restore(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	if s := useFileToken(a); s != "401" {
		t.Fatalf("token used after restore: %s, want 401", s)
	}
}

// fileHolds returns which of needles the data of the file at path holds.
// It reads only the file's data segments (SEEK_DATA, SEEK_HOLE), a MiB at
// a time: a sandbox's disk image under the data dir is a sparse file of
// many GiB (reading it whole took the test binary to 24 GiB and the OOM
// killer).
func fileHolds(path string, needles map[string][]byte) map[string]bool {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	longest := 1
	for _, n := range needles {
		longest = max(longest, len(n))
	}
	const chunk = 1 << 20
	buf := make([]byte, chunk+longest)
	found := map[string]bool{}
	fd := int(f.Fd())
	for off := int64(0); ; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil { // ENXIO: no data past off
			return found
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return found
		}
		carry := 0
		for pos := start; pos < end; {
			n, rerr := f.ReadAt(buf[carry:carry+int(min(chunk, end-pos))], pos)
			if n <= 0 {
				break
			}
			data := buf[:carry+n]
			for k, nd := range needles {
				if bytes.Contains(data, nd) {
					found[k] = true
				}
			}
			pos += int64(n)
			carry = min(longest-1, len(data))
			copy(buf, data[len(data)-carry:])
			if rerr != nil {
				break
			}
		}
		off = end
	}
}
