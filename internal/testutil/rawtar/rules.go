package rawtar

import (
	"archive/tar"
	"bytes"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Rule is one hostile or unusual archive and the error category each of
// agentbox's extractions (all package untar, with different options)
// refuses it with; nil means the archive is accepted (its entries
// extracted or skipped).
type Rule struct {
	Name string
	Tar  []byte
	// Layer is layers.ImportTar's answer, Image oci.ImportArchive's, and
	// Upload the guest's archive upload's.
	Layer, Image, Upload error
}

// Rules is the one table of tar rules the layer import, image import and
// guest upload tests share. Every archive but "hard link" is one entry, so
// a refusal leaves nothing behind; escapes through symlinks are tested
// where they are extracted (FuzzExtract, TestArchiveUploadRejectsEscapes).
func Rules() []Rule {
	x := bytes.Repeat([]byte("A"), 4096)
	one := func(es ...Entry) []byte {
		var b Builder
		for _, e := range es {
			b.Add(e)
		}
		return b.Bytes()
	}
	truncated := one(Entry{Name: "f", Mode: 0o644, Size: 1 << 20, Typeflag: '0', Data: x})[:Block+len(x)]
	inv, full := errdefs.ErrInvalidArgument, errdefs.ErrResourceExhausted
	return []Rule{
		{"pax sparse 1.0", PAXSparse1("f", 2<<30, x), inv, inv, inv},
		{"pax sparse 0.1", PAXSparse0("f", 2<<30, x), inv, inv, inv},
		{"old gnu sparse", OldGNUSparse("f", 2<<30, x), inv, inv, inv},
		{"unknown type", one(Entry{Name: "f", Typeflag: 'Z'}), inv, inv, inv},
		{"gnu dumpdir", one(Entry{Name: "f", Typeflag: 'D'}), inv, inv, inv},
		{"char device", one(Entry{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}), nil, inv, inv},
		{"block device", one(Entry{Name: "f", Typeflag: tar.TypeBlock, Devmajor: 7}), nil, inv, inv},
		{"fifo", one(Entry{Name: "p", Typeflag: tar.TypeFifo, Mode: 0o600}), nil, inv, nil},
		{"hard link", one(Entry{Name: "f", Typeflag: '0', Mode: 0o644, Size: 1, Data: x[:1]}, Entry{Name: "h", Typeflag: tar.TypeLink, Linkname: "f"}), nil, inv, nil},
		{"truncated", truncated, inv, inv, inv},
		{"declares 1 PiB", one(Entry{Name: "f", Mode: 0o644, Size: 1 << 50, Typeflag: '0', Data: x}), full, full, full},
		{"dotdot", one(Entry{Name: "../x", Typeflag: '0', Mode: 0o644, Size: 1, Data: x[:1]}), inv, inv, inv},
		{"absolute", one(Entry{Name: "/x", Typeflag: '0', Mode: 0o644, Size: 1, Data: x[:1]}), inv, inv, inv},
		{"hard link out", one(Entry{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}), inv, inv, inv},
	}
}
