package codeinterp

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// splitAll feeds data to a splitter in chunks of the given sizes and
// returns the pieces joined: the marker's places as "|".
func splitAll(marker string, data []byte, sizes []int) (string, [][]byte) {
	s := &splitter{marker: []byte(marker)}
	var out bytes.Buffer
	var datas [][]byte
	emit := func(ps []piece) {
		for _, p := range ps {
			if p.mark {
				out.WriteByte('|')
				continue
			}
			out.Write(p.data)
			datas = append(datas, p.data)
		}
	}
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if len(sizes) > 0 {
			n = min(max(1, sizes[i%len(sizes)]), len(data))
		}
		emit(s.feed(data[:n]))
		data = data[n:]
	}
	out.Write(s.flush())
	return out.String(), datas
}

func TestSplitter(t *testing.T) {
	const m = "\x1eEND\x1e"
	for _, tc := range []struct {
		in    string
		sizes []int
		want  string
	}{
		{"hello" + m + "next", nil, "hello|next"},
		{"a" + m + m + "b", []int{1}, "a||b"},
		{"\x1eEN\x1eEND\x1e", []int{2}, "\x1eEN|"},
		{"é" + m, []int{1}, "é|"},
		{"x\x1eEN", []int{1}, "x\x1eEN"},
	} {
		got, datas := splitAll(m, []byte(tc.in), tc.sizes)
		if got != tc.want {
			t.Errorf("%q in %v: %q, want %q", tc.in, tc.sizes, got, tc.want)
		}
		for _, d := range datas {
			if !utf8.Valid(d) && utf8.ValidString(tc.in) {
				t.Errorf("%q: piece %q cuts a rune", tc.in, d)
			}
		}
	}
}

// FuzzSplitter: however the stream is cut into reads, the pieces put
// back together are the stream with each marker replaced by "|", and no
// piece of valid UTF-8 input cuts a rune.
func FuzzSplitter(f *testing.F) {
	f.Add([]byte("a\x1eEND\x1eb"), []byte{1, 2, 3})
	f.Add([]byte("\x1e\x1eEND\x1e\x1eEN"), []byte{1})
	f.Add([]byte("ééé\x1eEND\x1e"), []byte{2})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		const m = "\x1eEND\x1e"
		sizes := make([]int, len(cuts))
		for i, c := range cuts {
			sizes[i] = int(c)
		}
		got, datas := splitAll(m, data, sizes)
		want := string(bytes.ReplaceAll(data, []byte(m), []byte("|")))
		if !bytes.Contains(data, []byte("|")) && got != want {
			t.Fatalf("%q cut %v: %q, want %q", data, sizes, got, want)
		}
		if utf8.Valid(data) && !bytes.Contains(data, []byte(m)) {
			for _, d := range datas {
				if !utf8.Valid(d) {
					t.Fatalf("%q cut %v: piece %q cuts a rune", data, sizes, d)
				}
			}
		}
	})
}
