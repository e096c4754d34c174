package pipeline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime"
)

// The run journal. A run is written to it as started before its command
// starts, its process id once the guest gave one, and its end once the
// finished record is in the store. A daemon that is killed (SIGKILL, a
// crash) leaves in the journal every run it did not see end; the next
// daemon reconciles each against its sandbox's guest (Pipeline.Recover).
//
// The journal is a file of JSON lines appended with one write(2) each and
// never synced: a killed daemon loses no write the kernel accepted (the
// page cache outlives the process), only a host crash can, and then the
// sandboxes and their processes are gone too. A synced commit per exec
// would triple an exec's round trip. A torn or unreadable line (a host
// crash mid-write) is skipped.
//
// The file is rewritten with only the runs still open when the daemon
// starts and whenever it has grown past journalCompactBytes.

// journalCompactBytes is the size past which the journal is rewritten.
const journalCompactBytes = 1 << 20

// maxJournalLine bounds one line of the journal when it is read.
const maxJournalLine = 4 << 20

// Journal operations.
const (
	journalStart = "start"
	journalPid   = "pid"
	journalEnd   = "end"
)

// journalEntry is one line of the journal.
type journalEntry struct {
	Op string `json:"op"`
	// ID is the run's id.
	ID string `json:"id"`
	// Run is the record as the run started (start).
	Run *api.Run `json:"run,omitempty"`
	// Ephemeral: the run's sandbox was created for it and is deleted
	// after it (start).
	Ephemeral bool `json:"ephemeral,omitempty"`
	// KeepOutput: the record keeps the output's tail (start).
	KeepOutput bool `json:"keep_output,omitempty"`
	// Stats are the sandbox's counters sampled before the command
	// started, at StatsAt (start; nil when the sandbox slept).
	Stats   *runtime.Stats `json:"stats,omitempty"`
	StatsAt time.Time      `json:"stats_at,omitzero"`
	// Pid is the run's process in its sandbox's guest (pid).
	Pid int `json:"pid,omitempty"`
}

// openRun is a run the journal saw start and not end.
type openRun struct {
	start journalEntry
	pid   int
}

// parseJournal returns the runs data (a journal's contents) records as
// started and not ended, in the order they started. Lines that do not
// parse, or that name no run, are skipped; so are pid and end lines of
// runs not started in data.
func parseJournal(data []byte) []openRun {
	open := map[string]*openRun{}
	var order []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), maxJournalLine)
	for sc.Scan() {
		var e journalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.ID == "" {
			continue
		}
		switch e.Op {
		case journalStart:
			if e.Run == nil || e.Run.ID != e.ID {
				continue
			}
			if _, dup := open[e.ID]; !dup {
				order = append(order, e.ID)
			}
			open[e.ID] = &openRun{start: e}
		case journalPid:
			if r, ok := open[e.ID]; ok && e.Pid > 0 {
				r.pid = e.Pid
			}
		case journalEnd:
			delete(open, e.ID)
		}
	}
	out := make([]openRun, 0, len(open))
	for _, id := range order {
		if r, ok := open[id]; ok {
			out = append(out, *r)
			delete(open, id) // a restarted id is listed once
		}
	}
	return out
}

// journal appends to the run journal. Safe for concurrent use. A nil
// *journal writes nothing (a pipeline without a journal).
type journal struct {
	path string

	// mu guards the fields below.
	mu   sync.Mutex
	f    *os.File
	size int64
	// open are the runs written as started and not yet ended, with their
	// start and pid lines, for compaction.
	open map[string]*openRun
	// err is the first write error; the journal stops writing after it.
	err error
}

// openJournal reads the journal at path, returns the runs it left open,
// and opens it for appending, rewritten to hold only those runs.
func openJournal(path string) (*journal, []openRun, error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("reading the run journal: %w", err)
	}
	runs := parseJournal(data)
	j := &journal{path: path, open: map[string]*openRun{}}
	for i := range runs {
		r := runs[i]
		j.open[r.start.ID] = &r
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.rewriteLocked(); err != nil {
		return nil, nil, err
	}
	return j, runs, nil
}

// rewriteLocked replaces the file with the start and pid lines of the
// open runs (written to a temporary file, synced and renamed over it).
func (j *journal) rewriteLocked() error {
	buf := encodeOpen(j.open)
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("rewriting the run journal: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(j.path))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("rewriting the run journal: %w", err)
	}
	nf, err := os.OpenFile(j.path, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("opening the run journal: %w", err)
	}
	if j.f != nil {
		_ = j.f.Close()
	}
	j.f, j.size = nf, int64(buf.Len())
	return nil
}

// encodeOpen is the journal of the open runs: their start and pid lines.
func encodeOpen(open map[string]*openRun) *bytes.Buffer {
	var buf bytes.Buffer
	for _, r := range open {
		writeLine(&buf, r.start)
		if r.pid > 0 {
			writeLine(&buf, journalEntry{Op: journalPid, ID: r.start.ID, Pid: r.pid})
		}
	}
	return &buf
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func writeLine(buf *bytes.Buffer, e journalEntry) {
	b, _ := json.Marshal(e) // journalEntry always encodes
	buf.Write(b)
	buf.WriteByte('\n')
}

// append writes e as one line and notes it in open.
func (j *journal) append(e journalEntry) error {
	if j == nil {
		return nil
	}
	var buf bytes.Buffer
	writeLine(&buf, e)
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err != nil {
		return j.err
	}
	switch e.Op {
	case journalStart:
		j.open[e.ID] = &openRun{start: e}
	case journalPid:
		if r, ok := j.open[e.ID]; ok {
			r.pid = e.Pid
		}
	case journalEnd:
		if _, ok := j.open[e.ID]; !ok {
			return nil // never journaled as started (it failed before)
		}
		delete(j.open, e.ID)
	}
	n, err := j.f.Write(buf.Bytes())
	j.size += int64(n)
	if err != nil {
		j.err = fmt.Errorf("writing the run journal: %w", err)
		return j.err
	}
	if j.size > journalCompactBytes && j.size > int64(len(j.open))*4<<10 {
		if err := j.rewriteLocked(); err != nil {
			j.err = err
			return err
		}
	}
	return nil
}

// started writes run rec as started, before its command starts.
func (j *journal) started(rec api.Run, ephemeral, keepOutput bool, stats *runtime.Stats, at time.Time) error {
	return j.append(journalEntry{Op: journalStart, ID: rec.ID, Run: &rec, Ephemeral: ephemeral, KeepOutput: keepOutput, Stats: stats, StatsAt: at})
}

// pid writes the process of run id.
func (j *journal) pid(id string, pid int) error {
	return j.append(journalEntry{Op: journalPid, ID: id, Pid: pid})
}

// ended writes run id as ended: its finished record is in the store.
func (j *journal) ended(id string) error {
	return j.append(journalEntry{Op: journalEnd, ID: id})
}

// close closes the file.
func (j *journal) close() error {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	if j.err == nil {
		j.err = errors.New("the run journal is closed")
	}
	return err
}
