package native

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// counter is one resource counter of a cgroup.
type counter int

const (
	cpuCounter counter = iota
	memoryCounter
	pidsCounter
	oomCounter
	numCounters
)

// counterFormat says how a counter's file reads.
type counterFormat int

const (
	counterUnread counterFormat = iota // the controller is not there: reads as 0
	plainNumber                        // the file holds one decimal number
	keyedNumber                        // "key value" lines; the counter is key's value
	keyedMicros                        // like keyedNumber, in microseconds (cpu.stat's usage_usec)
)

// counterSpec locates a counter: its file and, for keyed files, its key.
type counterSpec struct {
	path   string
	format counterFormat
	key    string
}

// counters reads a cgroup's resource counters through descriptors opened
// on first use and kept until close: a pread of an open cgroup file costs
// about a microsecond, an open, read and close of it more than ten (the
// path walk through cgroupfs), and every exec samples the counters twice
// to meter its run. A read after the cgroup was removed fails (ENODEV).
// Safe for concurrent use; close may run concurrently with reads.
type counters struct {
	specs [numCounters]counterSpec

	// mu guards files and closed.
	mu     sync.Mutex
	files  [numCounters]*os.File
	closed bool
}

// v1Counters are the counters of a cgroup v1 sandbox whose controller
// dirs are these; an empty dir is a controller that is not mounted.
func v1Counters(cpuacct, memory, pids string) *counters {
	c := &counters{}
	spec := func(dir, file string, format counterFormat, key string) counterSpec {
		if dir == "" {
			return counterSpec{}
		}
		return counterSpec{path: dir + "/" + file, format: format, key: key}
	}
	c.specs[cpuCounter] = spec(cpuacct, "cpuacct.usage", plainNumber, "")
	c.specs[memoryCounter] = spec(memory, "memory.usage_in_bytes", plainNumber, "")
	c.specs[pidsCounter] = spec(pids, "pids.current", plainNumber, "")
	c.specs[oomCounter] = spec(memory, "memory.oom_control", keyedNumber, "oom_kill")
	return c
}

// v2Counters are the counters of the cgroup v2 directory dir.
func v2Counters(dir string) *counters {
	c := &counters{}
	c.specs[cpuCounter] = counterSpec{path: dir + "/cpu.stat", format: keyedMicros, key: "usage_usec"}
	c.specs[memoryCounter] = counterSpec{path: dir + "/memory.current", format: plainNumber}
	c.specs[pidsCounter] = counterSpec{path: dir + "/pids.current", format: plainNumber}
	c.specs[oomCounter] = counterSpec{path: dir + "/memory.events", format: keyedNumber, key: "oom_kill"}
	return c
}

// stats reads every counter. The CPU counter is required; a missing
// memory or pids controller (or a kernel without oom_kill) reads as zero.
func (c *counters) stats() (runtime.Stats, error) {
	if c.specs[cpuCounter].format == counterUnread {
		return runtime.Stats{}, fmt.Errorf("no cpu accounting controller: %w", os.ErrNotExist)
	}
	cpu, err := c.read(cpuCounter)
	if err != nil {
		return runtime.Stats{}, err
	}
	s := runtime.Stats{CPUTime: time.Duration(cpu)}
	s.MemoryBytes, _ = c.read(memoryCounter)
	s.Pids, _ = c.read(pidsCounter)
	s.OOMKills, _ = c.read(oomCounter)
	return s, nil
}

// read returns counter i in its unit (nanoseconds for CPU time).
func (c *counters) read(i counter) (int64, error) {
	spec := c.specs[i]
	if spec.format == counterUnread {
		return 0, nil
	}
	f, err := c.file(i)
	if err != nil {
		return 0, err
	}
	var buf [512]byte
	n, err := pread(f, buf[:])
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", spec.path, err)
	}
	return parseCounter(buf[:n], spec)
}

// file returns the open file of counter i, opening it on first use.
func (c *counters) file(i counter) (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("reading %s: %w", c.specs[i].path, os.ErrClosed)
	}
	if f := c.files[i]; f != nil {
		return f, nil
	}
	f, err := os.Open(c.specs[i].path)
	if err != nil {
		return nil, err
	}
	c.files[i] = f
	return f, nil
}

// pread reads f from offset 0 in one call: a cgroup file's content is
// generated afresh by every read from the start. The file may be closed
// concurrently (the read then fails).
func pread(f *os.File, buf []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("%w (%v)", os.ErrClosed, err)
	}
	var (
		n    int
		rerr error
	)
	if err := rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Pread(int(fd), buf, 0)
			if !errors.Is(rerr, unix.EINTR) {
				return true
			}
		}
	}); err != nil {
		// The only failure of RawConn.Read itself: the file is closing.
		return 0, fmt.Errorf("%w (%v)", os.ErrClosed, err)
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == len(buf) {
		return 0, fmt.Errorf("more than %d bytes: %w", len(buf), io.ErrShortBuffer)
	}
	return n, nil
}

// parseCounter parses a counter file's content per spec.
func parseCounter(b []byte, spec counterSpec) (int64, error) {
	switch spec.format {
	case plainNumber:
		return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	case keyedNumber, keyedMicros:
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			k, v, ok := bytes.Cut(line, []byte(" "))
			if !ok || string(k) != spec.key {
				continue
			}
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s in %s: %w", spec.key, spec.path, err)
			}
			if spec.format == keyedMicros {
				n *= 1000
			}
			return n, nil
		}
		return 0, nil // a kernel without this key
	}
	return 0, nil
}

// close closes the open files; later reads fail.
func (c *counters) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for i, f := range c.files {
		if f != nil {
			_ = f.Close()
			c.files[i] = nil
		}
	}
}
