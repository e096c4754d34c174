package agentbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxEventLine bounds one NDJSON line. Events carry at most 1 MiB of payload,
// base64-encoded (4/3) plus the JSON around it; 8 MiB leaves ample room.
const maxEventLine = 8 << 20

// ndjson reads one JSON object per line from a stream.
type ndjson struct {
	r   *bufio.Reader
	buf []byte
}

func newNDJSON(r io.Reader) *ndjson { return &ndjson{r: bufio.NewReaderSize(r, 64<<10)} }

// next decodes the next non-empty line into v. It returns io.EOF at a clean
// end of stream, and any other error when reading or decoding fails.
func (d *ndjson) next(v any) error {
	for {
		line, err := d.line()
		if len(bytes.TrimSpace(line)) > 0 {
			if jerr := json.Unmarshal(line, v); jerr != nil {
				if err != nil { // a cut-off last line
					return fmt.Errorf("reading event stream: %w", io.ErrUnexpectedEOF)
				}
				return fmt.Errorf("decoding stream event: %w", jerr)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// line returns the next line without its newline. At the end of the stream
// it returns what is left together with the error (io.EOF when clean).
func (d *ndjson) line() ([]byte, error) {
	d.buf = d.buf[:0]
	for {
		chunk, err := d.r.ReadSlice('\n')
		d.buf = append(d.buf, chunk...)
		if len(d.buf) > maxEventLine {
			return nil, fmt.Errorf("reading event stream: line longer than %d bytes", maxEventLine)
		}
		switch {
		case err == nil:
			return d.buf[:len(d.buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return d.buf, err
		}
	}
}

// truncated is the error for a stream that ended (cleanly or not) before its
// final event.
func truncated(what string, err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", what, ErrStreamTruncated)
	}
	return fmt.Errorf("%s: %w: %w", what, ErrStreamTruncated, err)
}
