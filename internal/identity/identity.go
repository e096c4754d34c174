// Package identity is the one table of the files that make a sandbox's
// identity: /etc/machine-id and systemd's random seed. Sandboxes that
// share layers (the forks of one checkpoint, the sandboxes of one warm
// pool) must not share them, so each is written fresh for every such
// sandbox: into a fork's writable layer by the sandbox core
// (internal/sandbox), through a pooled sandbox's guest by the warm pool
// (internal/warmpool). Since each sandbox's copy is its own by design, a
// diff or merge of two sandboxes leaves them out unless asked
// (internal/snapshot).
package identity

import (
	"crypto/rand"
	"encoding/hex"
	"io/fs"
)

// File is one identity file.
type File struct {
	// Path is the file's absolute path inside the sandbox.
	Path string
	// Mode is the file's permission bits (owner: the sandbox's root).
	Mode fs.FileMode
	// New returns fresh content for one sandbox; every call differs.
	New func() []byte
}

// Files are the identity files, in a fixed order. Callers must not modify
// the slice.
var Files = []File{
	{Path: "/etc/machine-id", Mode: 0o444, New: func() []byte { return []byte(hex.EncodeToString(random(16)) + "\n") }},
	{Path: "/var/lib/systemd/random-seed", Mode: 0o600, New: func() []byte { return random(512) }},
}

// Is reports whether path (absolute, clean, as a sandbox sees it) is an
// identity file.
func Is(path string) bool {
	for _, f := range Files {
		if f.Path == path {
			return true
		}
	}
	return false
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	return b
}
