package redact

import (
	"errors"
	"io"
)

// readerStream is the stream name a Reader uses in its Redactor.
const readerStream = "\x00reader"

// Reader redacts a stream read through it (an HTTP response body, say):
// values split across reads are caught, and only a genuine partial match
// is held back until the next read or the end.
type Reader struct {
	rc   io.ReadCloser
	red  *Redactor
	buf  []byte
	out  []byte
	done bool
	err  error
}

// NewReader returns rc redacted by red. red must not be used by anything
// else while the Reader is read.
func NewReader(rc io.ReadCloser, red *Redactor) *Reader {
	return &Reader{rc: rc, red: red}
}

// Read implements io.Reader. A read error other than io.EOF is returned
// after the data before it, without what the redactor holds back (a
// partial value is never released unchecked).
func (r *Reader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.done {
			return 0, r.err
		}
		if r.buf == nil {
			r.buf = make([]byte, 32<<10)
		}
		n, err := r.rc.Read(r.buf)
		r.out = append(r.out, r.red.Write(readerStream, r.buf[:n])...)
		if err != nil {
			r.done, r.err = true, err
			if errors.Is(err, io.EOF) {
				r.out = append(r.out, r.red.Flush(readerStream)...)
				r.err = io.EOF
			}
		}
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// Close closes the underlying reader.
func (r *Reader) Close() error { return r.rc.Close() }
