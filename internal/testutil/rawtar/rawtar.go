// Package rawtar builds tar streams byte by byte for tests, including the
// hostile and legacy forms archive/tar's Writer refuses to emit: old-GNU
// sparse headers, PAX GNU.sparse records, device entries, unknown type
// flags. Nothing here validates anything; that is the point.
package rawtar

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
)

// Block is the tar block size.
const Block = 512

// Entry is one raw header. Fields left zero are written as zeros.
type Entry struct {
	Name     string
	Linkname string
	Mode     int64
	Size     int64 // the size field as written (it need not match Data)
	Typeflag byte
	Devmajor int64
	Devminor int64
	// GNU selects the old-GNU magic ("ustar  \x00") instead of USTAR's.
	GNU bool
	// Sparse, for old-GNU headers, are up to four (offset, length) pairs
	// written into the header's sparse array; RealSize is the logical size.
	Sparse   [][2]int64
	RealSize int64
	// Data follows the header, padded to a whole block.
	Data []byte
}

// Builder accumulates a tar stream.
type Builder struct{ buf bytes.Buffer }

// octal writes v as a NUL-terminated octal field, or in GNU base-256 when
// it does not fit (as for sizes of 8 GiB and more).
func octal(b []byte, v int64) {
	s := strconv.FormatInt(v, 8)
	if len(s) > len(b)-1 {
		for i := len(b) - 1; i > 0; i-- {
			b[i] = byte(v)
			v >>= 8
		}
		b[0] = 0x80
		return
	}
	// Leave room for the terminating NUL.
	for len(s) < len(b)-1 {
		s = "0" + s
	}
	copy(b, s)
}

// Add appends e's header block and its padded data.
func (b *Builder) Add(e Entry) *Builder {
	var h [Block]byte
	copy(h[0:100], e.Name)
	octal(h[100:108], e.Mode)
	octal(h[108:116], 0)
	octal(h[116:124], 0)
	octal(h[124:136], e.Size)
	octal(h[136:148], 0)
	h[156] = e.Typeflag
	copy(h[157:257], e.Linkname)
	if e.GNU {
		copy(h[257:265], "ustar  \x00")
	} else {
		copy(h[257:263], "ustar\x00")
		copy(h[263:265], "00")
	}
	octal(h[329:337], e.Devmajor)
	octal(h[337:345], e.Devminor)
	if e.GNU && len(e.Sparse) > 0 {
		for i, sp := range e.Sparse {
			if i == 4 {
				panic("rawtar: at most four sparse entries fit in the header")
			}
			off := 386 + i*24
			octal(h[off:off+12], sp[0])
			octal(h[off+12:off+24], sp[1])
		}
		octal(h[483:495], e.RealSize)
	}
	for i := 148; i < 156; i++ {
		h[i] = ' '
	}
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	b.buf.Write(h[:])
	b.buf.Write(e.Data)
	if r := len(e.Data) % Block; r != 0 {
		b.buf.Write(make([]byte, Block-r))
	}
	return b
}

// PAX appends a PAX extended header ('x') holding records, applying to the
// next entry.
func (b *Builder) PAX(records map[string]string) *Builder {
	keys := make([]string, 0, len(records))
	for k := range records {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var data []byte
	for _, k := range keys {
		data = append(data, paxRecord(k, records[k])...)
	}
	return b.Add(Entry{Name: "PaxHeaders/x", Mode: 0o644, Size: int64(len(data)), Typeflag: 'x', Data: data})
}

// paxRecord formats "%d %s=%s\n" where the length counts itself.
func paxRecord(k, v string) string {
	body := " " + k + "=" + v + "\n"
	n := len(body) + 1
	for {
		s := strconv.Itoa(n) + body
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

// Bytes returns the stream with its two terminating zero blocks.
func (b *Builder) Bytes() []byte {
	out := bytes.Clone(b.buf.Bytes())
	return append(out, make([]byte, 2*Block)...)
}

// PAXSparse1 is a GNU PAX sparse 1.0 entry: a logical file of realSize
// bytes holding data at offset 0 and everything else a hole, stored in a
// few KiB.
func PAXSparse1(name string, realSize int64, data []byte) []byte {
	var b Builder
	sparseMap := fmt.Sprintf("1\n0\n%d\n", len(data))
	payload := []byte(sparseMap)
	if r := len(payload) % Block; r != 0 {
		payload = append(payload, make([]byte, Block-r)...)
	}
	payload = append(payload, data...)
	b.PAX(map[string]string{
		"GNU.sparse.major":    "1",
		"GNU.sparse.minor":    "0",
		"GNU.sparse.name":     name,
		"GNU.sparse.realsize": strconv.FormatInt(realSize, 10),
	})
	b.Add(Entry{Name: "GNUSparseFile.0/" + name, Mode: 0o644, Size: int64(len(payload)), Typeflag: '0', Data: payload})
	return b.Bytes()
}

// PAXSparse0 is a GNU PAX sparse 0.1 entry (the map in GNU.sparse.map).
func PAXSparse0(name string, realSize int64, data []byte) []byte {
	var b Builder
	b.PAX(map[string]string{
		"GNU.sparse.size":      strconv.FormatInt(realSize, 10),
		"GNU.sparse.numblocks": "1",
		"GNU.sparse.map":       fmt.Sprintf("0,%d", len(data)),
	})
	b.Add(Entry{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: '0', Data: data})
	return b.Bytes()
}

// OldGNUSparse is an old-GNU 'S' entry of realSize logical bytes with data
// at offset 0.
func OldGNUSparse(name string, realSize int64, data []byte) []byte {
	var b Builder
	b.Add(Entry{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: 'S', GNU: true,
		Sparse: [][2]int64{{0, int64(len(data))}}, RealSize: realSize, Data: data})
	return b.Bytes()
}
