package redact

import (
	"encoding/base64"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
)

// feed writes data to the redactor in the given chunk sizes (cycled) and
// returns the released output plus the flush.
func feed(r *Redactor, data string, sizes ...int) string {
	var out []byte
	for i := 0; len(data) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(data))
		out = append(out, r.Write("stdout", []byte(data[:n]))...)
		data = data[n:]
	}
	return string(append(out, r.Flush("stdout")...))
}

func TestRedactorWhole(t *testing.T) {
	secret := "s3cr3t-v@lue/with+chars"
	r := New(map[string][]byte{"api": []byte(secret)})
	in := "before " + secret + " middle " + secret + secret + " after"
	got := feed(r, in, 4096)
	want := "before [REDACTED:api] middle [REDACTED:api][REDACTED:api] after"
	if got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestRedactorSplitChunks(t *testing.T) {
	secret := "ABCDEFGHIJKLMNOP"
	r := New(map[string][]byte{"k": []byte(secret)})
	in := "xx" + secret + "yy" + "ABCD" + "zz" + secret
	want := "xx[REDACTED:k]yyABCDzz[REDACTED:k]"
	// Every chunk size, including 1 byte at a time, and uneven cycles.
	for size := 1; size <= len(in); size++ {
		if got := feed(r, in, size); got != want {
			t.Fatalf("chunk size %d: got %q", size, got)
		}
	}
	if got := feed(r, in, 3, 7, 1, 11); got != want {
		t.Fatalf("uneven chunks: got %q", got)
	}
	// A near miss at the end is released by Flush, not lost.
	if got := feed(r, "tail ABCDEFG", 5); got != "tail ABCDEFG" {
		t.Fatalf("partial prefix at end: %q", got)
	}
}

func TestRedactorHoldsBackOnlyPartialMatches(t *testing.T) {
	r := New(map[string][]byte{"k": []byte("secretvalue")})
	if got := string(r.Write("stdout", []byte("prompt$ "))); got != "prompt$ " {
		t.Fatalf("unrelated output held back: %q", got)
	}
	if got := string(r.Write("stdout", []byte("abc secr"))); got != "abc " {
		t.Fatalf("got %q, want the non-matching part only", got)
	}
	if got := string(r.Write("stdout", []byte("etvalue!"))); got != "[REDACTED:k]!" {
		t.Fatalf("completion: %q", got)
	}
	// Streams are independent: a prefix on stderr does not join stdout.
	r.Write("stderr", []byte("secret"))
	if got := string(r.Write("stdout", []byte("value"))); got != "value" {
		t.Fatalf("streams mixed: %q", got)
	}
}

func TestRedactorEncodings(t *testing.T) {
	secret := "tok_en/with?odd&chars=+"
	r := New(map[string][]byte{"t": []byte(secret)})
	forms := []string{
		base64.StdEncoding.EncodeToString([]byte(secret)),
		base64.RawURLEncoding.EncodeToString([]byte(secret)),
		base64.URLEncoding.EncodeToString([]byte(secret)),
		url.QueryEscape(secret),
		url.PathEscape(secret),
		hex.EncodeToString([]byte(secret)),
	}
	for _, f := range forms {
		got := feed(r, "<"+f+">", 5)
		if got != "<[REDACTED:t]>" {
			t.Errorf("form %q: got %q", f, got)
		}
	}
}

func TestRedactorSeveralSecrets(t *testing.T) {
	r := New(map[string][]byte{"short": []byte("abc"), "long": []byte("abcdef"), "empty": nil})
	if got := feed(r, "abcdef abc ab", 2); got != "[REDACTED:long] [REDACTED:short] ab" {
		t.Fatalf("got %q", got)
	}
	if New(nil).Empty() != true || r.Empty() {
		t.Fatal("Empty wrong")
	}
	if got := New(nil).Write("stdout", []byte("x")); string(got) != "x" {
		t.Fatalf("pass-through: %q", got)
	}
	if s := r.RedactString("Bearer abcdef"); strings.Contains(s, "abc") {
		t.Fatalf("RedactString: %q", s)
	}
}

// TestRedactorChunkingInvariant: however the stream is cut, the output is
// the same as redacting it whole, and never contains a value.
func TestRedactorChunkingInvariant(t *testing.T) {
	vals := map[string][]byte{"a": []byte("abcab"), "b": []byte("cabx"), "c": []byte("abcabcabd")}
	alphabet := "abcdx"
	rng := uint64(42)
	next := func(n int) int {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return int(rng % uint64(n))
	}
	for iter := 0; iter < 2000; iter++ {
		var sb strings.Builder
		for i := 0; i < 40; i++ {
			sb.WriteByte(alphabet[next(len(alphabet))])
		}
		in := sb.String()
		want := feed(New(vals), in, len(in))
		got := feed(New(vals), in, 1+next(5), 1+next(9), 1+next(3))
		if got != want {
			t.Fatalf("input %q: chunked %q, whole %q", in, got, want)
		}
		clean := strings.NewReplacer("[REDACTED:a]", "|", "[REDACTED:b]", "|", "[REDACTED:c]", "|").Replace(got)
		for _, v := range vals {
			if strings.Contains(clean, string(v)) {
				t.Fatalf("input %q: output %q still holds %q", in, got, v)
			}
		}
	}
}
