package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Limits bound what the recorder keeps.
type Limits struct {
	// MaxBytes bounds one sandbox's log; events beyond it are dropped and
	// counted in a "dropped" event written into a reserve kept for it.
	MaxBytes int64
	// MaxEvents bounds one sandbox's number of events likewise.
	MaxEvents uint64
	// SignEvery is how many records may follow the last signed head
	// before the next is signed (also signed on Flush, delete and close).
	SignEvery uint64
	// Retention is how long a deleted sandbox's record is kept.
	Retention time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxBytes  = 64 << 20
	DefaultMaxEvents = 1_000_000
	DefaultSignEvery = 256
	DefaultRetention = 7 * 24 * time.Hour
	// dropReserve is the part of MaxBytes kept for "dropped" records.
	dropReserve = 64 << 10
)

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxBytes < 2*dropReserve {
		l.MaxBytes = 2 * dropReserve
	}
	if l.MaxEvents == 0 {
		l.MaxEvents = DefaultMaxEvents
	}
	if l.SignEvery == 0 {
		l.SignEvery = DefaultSignEvery
	}
	if l.Retention <= 0 {
		l.Retention = DefaultRetention
	}
	return l
}

// Store keeps every sandbox's hash-chained record below one directory.
// Its methods are safe for concurrent use; appends to one sandbox's record
// are serialised, in the order they are made.
type Store struct {
	dir    string
	key    ed25519.PrivateKey
	pub    ed25519.PublicKey
	limits Limits
	log    *slog.Logger

	// mu guards chains and closed.
	mu     sync.Mutex
	chains map[string]*chain
	closed bool
}

// chain is one sandbox's open record.
type chain struct {
	id  string
	dir string

	// mu guards the fields below.
	mu        sync.Mutex
	f         *os.File // nil once finished (deleted sandbox, closed store)
	seq       uint64
	hash      string
	size      int64
	signedSeq uint64
	// dropped counts events not recorded since droppedSince, not yet
	// reported by a "dropped" record.
	dropped      int64
	droppedSince time.Time
	// changed is closed (and replaced) at every append: followers wait
	// on it.
	changed chan struct{}
	// finished is set when the sandbox was deleted or the store closed.
	finished bool
}

// OpenStore opens (creating) the record directory dir, signing heads with
// key.
func OpenStore(dir string, key ed25519.PrivateKey, limits Limits, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating audit dir: %w", err)
	}
	return &Store{dir: dir, key: key, pub: key.Public().(ed25519.PublicKey), limits: limits.withDefaults(), log: log, chains: map[string]*chain{}}, nil
}

// PublicKey is the key heads are verified with.
func (s *Store) PublicKey() ed25519.PublicKey { return s.pub }

// Limits returns the store's limits, defaults applied.
func (s *Store) Limits() Limits { return s.limits }

func (s *Store) sandboxDir(id string) (string, error) {
	if id == "" || strings.ContainsAny(id, `/\`) || id == "." || id == ".." || strings.HasPrefix(id, ".") {
		return "", fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(s.dir, id), nil
}

// chain returns sandbox id's open chain, opening (and creating) its
// record. owner is written with a new record.
func (s *Store) chain(id, owner string) (*chain, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("audit store closed: %w", errdefs.ErrUnavailable)
	}
	if c := s.chains[id]; c != nil {
		return c, nil
	}
	dir, err := s.sandboxDir(id)
	if err != nil {
		return nil, err
	}
	c, err := openChain(id, dir, owner, s.log)
	if err != nil {
		return nil, err
	}
	s.chains[id] = c
	return c, nil
}

// openChain opens dir's log for appending and reads its tail: the last
// record's seq and hash. A torn last line (a crash mid-write) is cut off.
func openChain(id, dir, owner string, log *slog.Logger) (*chain, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating audit record of %s: %w", id, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "deleted")); err == nil {
		// An id is never reused; a record of a deleted sandbox is
		// finished.
		return nil, fmt.Errorf("audit record of %s is finished (sandbox deleted): %w", id, errdefs.ErrFailedPrecondition)
	}
	if owner != "" {
		if _, err := os.Stat(filepath.Join(dir, "owner")); errors.Is(err, fs.ErrNotExist) {
			if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(owner), 0o600); err != nil {
				return nil, fmt.Errorf("audit record of %s: %w", id, err)
			}
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "log.jsonl"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening audit record of %s: %w", id, err)
	}
	c := &chain{id: id, dir: dir, f: f, hash: zeroHash, changed: make(chan struct{})}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	c.size = fi.Size()
	if c.size > 0 {
		last, end, err := lastLine(f, c.size)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("audit record of %s: %w", id, err)
		}
		if end < c.size {
			log.Warn("audit: cutting off a torn last record", "sandbox", id, "bytes", c.size-end)
			if err := f.Truncate(end); err != nil {
				f.Close()
				return nil, err
			}
			c.size = end
		}
		if last != nil {
			r, err := decodeRecord(last)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("audit record of %s: last record: %w", id, err)
			}
			c.seq, c.hash = r.Seq, r.Hash
		}
	}
	if h, ok := lastHead(dir); ok {
		c.signedSeq = h.Seq
	}
	return c, nil
}

// lastLine returns the last complete line of f (size bytes; nil when
// there is none) and the offset just past its newline.
func lastLine(f *os.File, size int64) ([]byte, int64, error) {
	const chunk = 64 << 10
	var buf []byte
	end := int64(-1) // offset after the last newline
	for off := size; off > 0 && int64(len(buf)) <= maxLine+chunk; {
		n := min(int64(chunk), off)
		off -= n
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
			return nil, 0, err
		}
		buf = append(b, buf...)
		if end < 0 {
			if i := bytes.LastIndexByte(buf, '\n'); i >= 0 {
				end = off + int64(i) + 1
				buf = buf[:i]
			} else {
				continue
			}
		}
		if i := bytes.LastIndexByte(buf, '\n'); i >= 0 {
			return buf[i+1:], end, nil
		}
		if off == 0 {
			return buf, end, nil
		}
	}
	if end < 0 {
		return nil, 0, nil
	}
	return nil, 0, fmt.Errorf("last record longer than %d bytes: %w", maxLine, errdefs.ErrInvalidArgument)
}

// lastHead returns the newest signed head kept in dir (unverified).
func lastHead(dir string) (head, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "heads.jsonl"))
	if err != nil {
		return head{}, false
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var h head
		if json.Unmarshal(lines[i], &h) == nil {
			return h, true
		}
	}
	return head{}, false
}

// Append records ev (Seq set here) for sandbox ev.SandboxID owned by
// owner and returns its sequence number. It never blocks on anything but
// the sandbox's record's file. An event beyond the sandbox's bound is
// dropped and counted (see Limits): Append returns 0 then.
func (s *Store) Append(owner string, ev api.SandboxEvent) (uint64, error) {
	c, err := s.chain(ev.SandboxID, owner)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished {
		return 0, fmt.Errorf("audit record of %s is finished: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if c.seq >= s.limits.MaxEvents || c.size >= s.limits.MaxBytes-dropReserve {
		s.dropLocked(c, ev.Time)
		return 0, nil
	}
	before := c.seq
	if err := s.appendLocked(c, ev); err != nil {
		return 0, err
	}
	if c.seq == before {
		return 0, nil // dropped: the line did not fit
	}
	if c.seq-c.signedSeq >= s.limits.SignEvery || c.signedSeq == 0 {
		if err := s.signLocked(c); err != nil {
			return c.seq, err
		}
	}
	return c.seq, nil
}

func (s *Store) dropLocked(c *chain, t time.Time) {
	if c.dropped == 0 {
		c.droppedSince = t
	}
	c.dropped++
}

// appendLocked writes ev as the chain's next record.
func (s *Store) appendLocked(c *chain, ev api.SandboxEvent) error {
	ev.Seq = c.seq + 1
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encoding audit event: %w", err)
	}
	line, hash := encodeRecord(c.id, ev.Seq, c.hash, b)
	if c.size+int64(len(line)) > s.limits.MaxBytes {
		s.dropLocked(c, ev.Time)
		return nil
	}
	if _, err := c.f.Write(line); err != nil {
		return fmt.Errorf("writing audit record of %s: %w", c.id, err)
	}
	c.seq, c.hash = ev.Seq, hash
	c.size += int64(len(line))
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

// signLocked appends a signed head of the chain as it is now.
func (s *Store) signLocked(c *chain) error {
	if c.seq == 0 || c.seq == c.signedSeq {
		return nil
	}
	h := signHead(s.key, c.id, c.seq, c.hash, time.Now())
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(c.dir, "heads.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("signing audit head of %s: %w", c.id, err)
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("signing audit head of %s: %w", c.id, err)
	}
	c.signedSeq = c.seq
	return nil
}

// flushLocked reports dropped events and signs the head.
func (s *Store) flushLocked(c *chain) error {
	if c.dropped > 0 {
		n, since := c.dropped, c.droppedSince
		c.dropped = 0
		ev := api.SandboxEvent{Time: time.Now().UTC(), SandboxID: c.id, Type: api.EventDropped,
			Dropped: &api.DroppedEvents{Count: n, Since: since}}
		if err := s.appendLocked(c, ev); err != nil {
			return err
		}
	}
	return s.signLocked(c)
}

// Flush reports every open record's dropped events and signs its head
// (the recorder calls it periodically).
func (s *Store) Flush() error {
	s.mu.Lock()
	chains := make([]*chain, 0, len(s.chains))
	for _, c := range s.chains {
		chains = append(chains, c)
	}
	s.mu.Unlock()
	var errs []error
	for _, c := range chains {
		c.mu.Lock()
		if !c.finished {
			errs = append(errs, s.flushLocked(c))
		}
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Finish closes sandbox id's record for good (the sandbox was deleted):
// dropped events are reported, the head signed and the record marked
// deleted; it is removed after the retention period (Sweep).
func (s *Store) Finish(id string) error {
	dir, err := s.sandboxDir(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	c := s.chains[id]
	s.mu.Unlock()
	if c == nil {
		if _, err := os.Stat(dir); err != nil {
			return nil // never recorded
		}
		return markDeleted(dir)
	}
	c.mu.Lock()
	err = s.flushLocked(c)
	// Marked before followers are woken: a reopen then sees it finished.
	err = errors.Join(err, markDeleted(dir))
	c.finishLocked()
	c.mu.Unlock()
	s.mu.Lock()
	if s.chains[id] == c {
		delete(s.chains, id)
	}
	s.mu.Unlock()
	return err
}

func markDeleted(dir string) error {
	return os.WriteFile(filepath.Join(dir, "deleted"), []byte(time.Now().UTC().Format(time.RFC3339Nano)), 0o600)
}

func (c *chain) finishLocked() {
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
	c.finished = true
	close(c.changed)
	c.changed = make(chan struct{})
}

// Close signs every open record's head and closes it. Appends fail after.
func (s *Store) Close() error {
	err := s.Flush()
	s.mu.Lock()
	s.closed = true
	chains := s.chains
	s.chains = map[string]*chain{}
	s.mu.Unlock()
	for _, c := range chains {
		c.mu.Lock()
		c.finishLocked()
		c.mu.Unlock()
	}
	return err
}

// Sweep removes the records of sandboxes deleted longer than the
// retention period ago, as of now.
func (s *Store) Sweep(now time.Time) (removed int, err error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name(), "deleted"))
		if err != nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
		if err != nil || now.Sub(t) < s.limits.Retention {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// Info is what the store knows of a sandbox's record without reading it.
type Info struct {
	Owner   string
	Deleted bool
}

// Info returns the owner and state of sandbox id's record (ErrNotFound
// when there is none).
func (s *Store) Info(id string) (Info, error) {
	dir, err := s.sandboxDir(id)
	if err != nil {
		return Info{}, err
	}
	if _, err := os.Stat(dir); err != nil {
		return Info{}, fmt.Errorf("audit record of %s: %w", id, errdefs.ErrNotFound)
	}
	owner, _ := os.ReadFile(filepath.Join(dir, "owner"))
	_, derr := os.Stat(filepath.Join(dir, "deleted"))
	return Info{Owner: string(owner), Deleted: derr == nil}, nil
}

// IDs lists the sandboxes that have a record.
func (s *Store) IDs() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// scan calls fn for every record of sandbox id's log from byte offset
// off, in order, and returns the offset after the last complete line. It
// reads what was written when it started, not what is appended later.
func (s *Store) scan(id string, off int64, fn func(r record) error) (int64, error) {
	return s.scanTo(id, off, -1, fn)
}

// scanTo is scan that stops at byte end (-1: the end of the file).
func (s *Store) scanTo(id string, off, end int64, fn func(r record) error) (int64, error) {
	dir, err := s.sandboxDir(id)
	if err != nil {
		return off, err
	}
	f, err := os.Open(filepath.Join(dir, "log.jsonl"))
	if errors.Is(err, fs.ErrNotExist) {
		return off, nil
	}
	if err != nil {
		return off, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return off, err
	}
	var rd io.Reader = f
	if end >= 0 {
		rd = io.LimitReader(f, end-off)
	}
	br := bufio.NewReaderSize(rd, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			var long []byte
			long = append(long, line...)
			for errors.Is(err, bufio.ErrBufferFull) && len(long) <= maxLine {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return off, nil // a partial line is not read yet
			}
			return off, err
		}
		r, derr := decodeRecord(line[:len(line)-1])
		if derr != nil {
			return off, fmt.Errorf("audit record of %s at byte %d: %w", id, off, derr)
		}
		off += int64(len(line))
		if err := fn(r); err != nil {
			return off, err
		}
	}
}

// changes returns the channel closed at live sandbox id's next append
// (opening its record) and whether its record is finished.
func (s *Store) changes(id, owner string) (<-chan struct{}, bool, error) {
	c, err := s.chain(id, owner)
	if err != nil {
		return nil, true, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed, c.finished, nil
}
