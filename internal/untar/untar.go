// Package untar is agentbox's one tar extractor: it writes a tar stream
// beneath a root directory without ever writing outside it or through a
// symlink. The guest's archive upload, layer import (layers.ImportTar),
// the spooling of image archives (oci) and the CLI's download of a
// directory (agentbox cp) all extract through it; what
// differs between them (which entry types are kept, ownership, modes,
// xattrs, overlay whiteouts, the free-space reserve) is an Options value.
//
// It imports only x/sys, errdefs and tarcheck, so the guest can use it.
//
// # Rules every extraction follows
//
//   - Names: relative, cleaned, no NUL, at most MaxNameLen bytes and no
//     ".." component; "./x" is "x". An entry naming the root itself (".",
//     "./" or "") is skipped unless Options.SetRoot.
//   - Beneath the root: every parent directory is resolved with openat2
//     RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS below
//     the root descriptor, so an entry whose path crosses a symlink (for
//     example one the same archive planted) or leaves the root is refused.
//     Missing parents are created (0755 less Options.Umask, or 0700 when
//     Options.Perm is 0) and given Options.Owner(0, 0).
//   - Sparse entries (package tarcheck) and unknown types are refused; PAX
//     global headers carry no file and are skipped.
//   - Room: before an entry is written its directory's filesystem must
//     have a free inode and room for the declared size while keeping
//     Options.ReservePercent free (tarcheck.Room, ErrResourceExhausted).
//   - Regular files (including contiguous 'TypeCont' ones) are written to
//     a temporary name beside the target and renamed over it, so a failed
//     or truncated entry leaves nothing behind and a symlink planted at
//     the name is replaced, never written through. A read error of the
//     archive is an invalid argument.
//   - Whatever sits at an entry's name is replaced (a later entry wins),
//     except a directory, which a directory entry keeps and any other
//     entry is refused by (errdefs.ErrAlreadyExists).
//   - Symlinks are created as they are (never followed; empty targets or
//     ones with NUL are refused). Hard links must name an earlier entry
//     beneath the root (not the root); a symlink target is linked itself.
//   - Modification times are set as far as the filesystem allows (a
//     failure does not fail the entry), directories' last, deepest first.
//
// Errors wrap an errdefs category where the archive is at fault
// (ErrInvalidArgument), the filesystem is full (ErrResourceExhausted) or
// a directory is in the way (ErrAlreadyExists); system call failures are
// *os.PathError. On error, entries extracted before the failing one stay;
// the failing entry leaves nothing.
package untar

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tarcheck"
)

// MaxNameLen is the longest entry name (and hard link target) accepted.
const MaxNameLen = 4096

// OpaqueXattr marks an opaque directory in an unprivileged overlay; see
// Options.Whiteouts.
const OpaqueXattr = "user.overlay.opaque"

// Action is what happens to entries of an optional type.
type Action uint8

const (
	// Refuse fails the extraction with errdefs.ErrInvalidArgument (the
	// zero value).
	Refuse Action = iota
	// Skip ignores the entry.
	Skip
	// Create creates the entry.
	Create
)

// Options chooses how entries are extracted. The zero value extracts
// regular files, directories and symlinks owned by the calling process
// (files 0600, directories 0700), refuses everything else, and keeps no
// reserve.
type Options struct {
	// HardLinks and FIFOs say what happens to hard link and FIFO entries.
	HardLinks, FIFOs Action
	// Devices says what happens to character and block device entries;
	// Create is treated as Refuse: no device node is ever created (an
	// overlay whiteout is not a device, see Whiteouts).
	Devices Action

	// Perm masks each entry's permission bits (0o7777 keeps setuid,
	// setgid and sticky; 0o777 drops them). Zero ignores the archive's
	// modes: files stay 0600 and directories 0700.
	Perm uint32
	// Umask clears its bits from every mode set (after Perm), as a
	// process umask would for files it creates; the mode of parent
	// directories made for an entry too. Zero clears nothing. Ignored
	// when Perm is zero.
	Umask uint32
	// OwnerWritableDirs gives every directory entry rwx for its owner
	// (before Umask), so that later entries can be written into it
	// whatever mode the archive gives it (a host extraction by an
	// unprivileged user: agentbox cp). Ignored when Perm is zero.
	OwnerWritableDirs bool
	// Owner, when set, maps an entry's uid and gid to the owner it is
	// given (after which its mode is set, as chown clears setuid); an
	// error refuses the entry. Nil leaves entries owned by the process.
	Owner func(uid, gid int) (int, int, error)
	// OwnerBestEffort ignores failures to change an owner (a process
	// that may not own every id), rather than failing the entry.
	OwnerBestEffort bool
	// Xattrs keeps the entries' user.* extended attributes (PAX
	// SCHILY.xattr records); all others, security.capability included,
	// are dropped.
	Xattrs bool
	// Whiteouts extracts overlay whiteouts: a character device 0:0 entry
	// is created as one, the OCI/AUFS forms ".wh.NAME" and ".wh..wh..opq"
	// become a whiteout of NAME and OpaqueXattr=y on their directory, and
	// a trusted.overlay.opaque xattr is kept as OpaqueXattr.
	Whiteouts bool
	// SetRoot applies the owner, mode, xattrs and time of an entry naming
	// the root to the root directory; such an entry must then be a
	// directory.
	SetRoot bool
	// ReservePercent of the target filesystem's blocks stays free.
	ReservePercent uint64
	// CheckDir, when set, is called with each entry's parent directory
	// before anything is written there; an error fails the entry (the
	// guest refuses kernel pseudo filesystems mounted below the root).
	CheckDir func(fd int, rel string) error
	// Log, when set, receives skipped entries at debug level.
	Log *slog.Logger
}

// Extract extracts the tar stream r beneath the directory rootFD (any
// descriptor of it, O_PATH will do) by the package rules and opts. It
// reads r up to the archive's end marker, checking ctx before each entry.
// rootFD stays open. Safe for concurrent use on different roots.
func Extract(ctx context.Context, rootFD int, r io.Reader, opts Options) error {
	x := &extractor{root: rootFD, opts: opts}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errdefs.IsInvalidArgument(err) {
				return err
			}
			return fmt.Errorf("reading tar stream: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue // archive-wide metadata, no file
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("tar entry %q: %w", clip(hdr.Name), err)
		}
	}
	x.finish()
	return nil
}

// CleanName validates a tar entry name (or hard link target) and returns
// it relative to the root, "." for the root itself.
func CleanName(name string) (string, error) {
	if len(name) > MaxNameLen || strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("name is not valid: %w", errdefs.ErrInvalidArgument)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("absolute path: %w", errdefs.ErrInvalidArgument)
	}
	var b strings.Builder
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "..":
			return "", fmt.Errorf("path escapes the target directory: %w", errdefs.ErrInvalidArgument)
		case "", ".":
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(c)
	}
	if b.Len() == 0 {
		return ".", nil
	}
	return b.String(), nil
}

// typeAction is what opts says about hdr's type, before any name rule.
func (o *Options) typeAction(hdr *tar.Header) (Action, error) {
	if tarcheck.Sparse(hdr) {
		return Refuse, tarcheck.ErrSparse(hdr.Name)
	}
	refuse := func(why string) (Action, error) {
		return Refuse, fmt.Errorf("%s: %w", why, errdefs.ErrInvalidArgument)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeCont, tar.TypeDir, tar.TypeSymlink:
		return Create, nil
	case tar.TypeLink:
		if o.HardLinks == Refuse {
			return refuse("hard links are not extracted")
		}
		return o.HardLinks, nil
	case tar.TypeFifo:
		if o.FIFOs == Refuse {
			return refuse("FIFOs are not extracted")
		}
		return o.FIFOs, nil
	case tar.TypeChar:
		if o.Whiteouts && hdr.Devmajor == 0 && hdr.Devminor == 0 {
			return Create, nil
		}
		fallthrough
	case tar.TypeBlock:
		if o.Devices != Skip {
			return refuse("device files are not extracted")
		}
		return Skip, nil
	}
	return refuse(fmt.Sprintf("entry type %q is not supported", hdr.Typeflag))
}

func clip(s string) string {
	const n = 256
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

type dirTime struct {
	rel string
	t   time.Time
}
