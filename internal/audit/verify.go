package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// errTampered marks a problem found by Verify (as opposed to an I/O
// error reading the record).
var errTampered = errors.New("record does not verify")

// Verify checks sandbox id's record: every line decodes; sequence numbers
// run 1, 2, 3, ...; every record links to the hash of the one before and
// its own hash is right; every signed head's signature verifies with the
// store's key and names a record with that hash; and the last signed head
// is not beyond the end of the log (a truncated tail). Records appended
// after the last signed head verify by their chain only: deleting them
// is detected once a later head is signed (docs/AUDIT.md).
//
// An I/O error is returned as an error; a record that does not verify is
// a result with OK false and the first problem named.
func (s *Store) Verify(id string) (api.AuditVerifyResult, error) {
	res := api.AuditVerifyResult{SandboxID: id}
	info, err := s.Info(id)
	if err != nil {
		return res, err
	}
	res.Deleted = info.Deleted
	dir, _ := s.sandboxDir(id)
	// The heads and the log's length are read together, with the chain
	// held still (a record appended between them would look like a
	// truncation); the log is then verified up to that length while
	// appends go on.
	s.mu.Lock()
	c := s.chains[id]
	s.mu.Unlock()
	end := int64(-1)
	if c != nil {
		c.mu.Lock()
		if !c.finished {
			end = c.size
		}
	}
	heads, problem, err := s.readHeads(id, dir)
	if c != nil {
		c.mu.Unlock()
	}
	if err != nil {
		return res, err
	}
	if problem != "" {
		res.Problem = problem
		return res, nil
	}
	want := map[uint64]string{}
	for _, h := range heads {
		want[h.Seq] = h.Hash
		res.Signed = max(res.Signed, h.Seq)
	}
	prev := zeroHash
	var seq uint64
	_, err = s.scanTo(id, 0, end, func(r record) error {
		switch {
		case r.Seq != seq+1:
			return fmt.Errorf("%w: record %d follows record %d (deleted or reordered)", errTampered, r.Seq, seq)
		case r.Prev != prev:
			return fmt.Errorf("%w: record %d does not link to record %d (deleted, reordered or edited)", errTampered, r.Seq, seq)
		case recordHash(id, r.Seq, r.Prev, r.Event) != r.Hash:
			return fmt.Errorf("%w: record %d was edited (its hash does not match its content)", errTampered, r.Seq)
		}
		if h, ok := want[r.Seq]; ok && h != r.Hash {
			return fmt.Errorf("%w: record %d differs from its signed head", errTampered, r.Seq)
		}
		seq, prev = r.Seq, r.Hash
		return nil
	})
	if err != nil {
		if errors.Is(err, errTampered) || errors.Is(err, errdefs.ErrInvalidArgument) {
			// A malformed line is an edit too.
			res.Events, res.Head, res.Problem = seq, prev, err.Error()
			return res, nil
		}
		return res, err
	}
	res.Events = seq
	if seq > 0 {
		res.Head = prev
	}
	switch {
	case res.Signed > seq:
		res.Problem = fmt.Sprintf("the log ends at record %d but record %d was signed: its tail was truncated", seq, res.Signed)
	case seq > 0 && len(heads) == 0:
		res.Problem = "no signed head: the heads file was deleted"
	default:
		res.OK = true
	}
	return res, nil
}

// readHeads reads and checks the signatures of dir's heads.
func (s *Store) readHeads(id, dir string) ([]head, string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "heads.jsonl"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	var heads []head
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 1<<16)
	for n := 1; sc.Scan(); n++ {
		var h head
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&h); err != nil {
			return nil, fmt.Sprintf("signed head %d is malformed: %v", n, err), nil
		}
		if !verifyHead(s.pub, id, h) {
			return nil, fmt.Sprintf("signed head %d (record %d) has a bad signature", n, h.Seq), nil
		}
		heads = append(heads, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Sprintf("heads file: %v", err), nil
	}
	return heads, "", nil
}
