package codeinterp

import (
	"bytes"
	"unicode/utf8"
)

// splitter cuts one output stream of a driver (its stdout or stderr) at
// the marker the driver writes after each cell, so that the bytes before
// the marker are the cell's and those after it the next one's, although
// they arrive on a pipe separate from the driver's "done" event.
//
// It passes bytes on as soon as they cannot be part of a marker, holding
// back only a tail that is a prefix of the marker, and an incomplete UTF-8
// sequence at the end (a stream event's text is a JSON string: a rune cut
// in two would become two replacement characters). What it holds back is
// passed on with the next bytes, or before the marker.
//
// A splitter is not safe for concurrent use.
type splitter struct {
	marker  []byte
	pending []byte
}

// piece is a run of a stream's bytes, or (mark set, data empty) the
// marker's place in it.
type piece struct {
	data []byte
	mark bool
}

// feed appends p and returns what can be passed on, in order.
func (s *splitter) feed(p []byte) []piece {
	s.pending = append(s.pending, p...)
	var out []piece
	for {
		i := bytes.Index(s.pending, s.marker)
		if i < 0 {
			break
		}
		if i > 0 {
			out = append(out, piece{data: bytes.Clone(s.pending[:i])})
		}
		out = append(out, piece{mark: true})
		s.pending = s.pending[i+len(s.marker):]
	}
	keep := partialSuffix(s.pending, s.marker)
	if keep == 0 {
		keep = incompleteRune(s.pending)
	}
	if n := len(s.pending) - keep; n > 0 {
		out = append(out, piece{data: bytes.Clone(s.pending[:n])})
		s.pending = append(s.pending[:0], s.pending[n:]...)
	}
	return out
}

// flush returns whatever is held back (the stream ended).
func (s *splitter) flush() []byte {
	b := s.pending
	s.pending = nil
	return b
}

// partialSuffix returns the length of the longest suffix of b that is a
// proper prefix of marker.
func partialSuffix(b, marker []byte) int {
	n := min(len(marker)-1, len(b))
	for ; n > 0; n-- {
		if bytes.HasPrefix(marker, b[len(b)-n:]) {
			return n
		}
	}
	return 0
}

// incompleteRune returns the length of an incomplete UTF-8 sequence at
// the end of b that more bytes could complete (0 when there is none).
func incompleteRune(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0 // ASCII: complete
		}
		if utf8.RuneStart(c) {
			// A lead byte: incomplete if its sequence is longer than n.
			want := 0
			switch {
			case c&0xE0 == 0xC0:
				want = 2
			case c&0xF0 == 0xE0:
				want = 3
			case c&0xF8 == 0xF0:
				want = 4
			}
			if want > n {
				return n
			}
			return 0
		}
	}
	return 0
}
