// Package lazyregexp is a regexp.Regexp compiled on first use, after Go's
// own cmd/go/internal/lazyregexp.
//
// Every process started from the agentbox binary runs the package
// initialisers of all of it: the daemon, each CLI call, and the guest of
// every sandbox, which validates none of these names. Compiled at init, the
// validation patterns (counted repetitions such as {0,127} expand into
// large programs) took half of the binary's initialisation, about 2 ms of
// CPU per process start (GODEBUG=inittrace=1: 3.5 ms in all, 1.7 ms
// without them), an eighth of the CPU a sandbox create costs. Declared
// with New, a pattern costs nothing until it is used.
package lazyregexp

import (
	"os"
	"regexp"
	"strings"
	"sync"
)

// Regexp is a regexp.Regexp compiled on first use. Safe for concurrent use.
type Regexp struct {
	str  string
	once sync.Once
	rx   *regexp.Regexp
}

func (r *Regexp) re() *regexp.Regexp {
	r.once.Do(func() { r.rx = regexp.MustCompile(r.str) })
	return r.rx
}

// MatchString reports whether s contains a match of the pattern.
func (r *Regexp) MatchString(s string) bool { return r.re().MatchString(s) }

// String returns the source text of the pattern.
func (r *Regexp) String() string { return r.str }

// inTest compiles patterns at once in test binaries, so a bad pattern
// fails every test of its package instead of the first one that uses it.
var inTest = len(os.Args) > 0 && strings.HasSuffix(strings.TrimSuffix(os.Args[0], ".exe"), ".test")

// New returns a Regexp that compiles str (panicking if it does not
// compile, like regexp.MustCompile) when first used.
func New(str string) *Regexp {
	r := &Regexp{str: str}
	if inTest {
		r.re()
	}
	return r
}
