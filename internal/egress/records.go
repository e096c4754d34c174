package egress

import (
	"sync"

	"github.com/agentbox/agentbox/api"
)

// recordRing keeps a sandbox's newest egress records.
type recordRing struct {
	// mu guards the fields below.
	mu   sync.Mutex
	buf  []api.EgressRecord
	next int
	full bool
}

func newRecordRing(n int) *recordRing { return &recordRing{buf: make([]api.EgressRecord, n)} }

func (r *recordRing) add(rec api.EgressRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = rec
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
}

// list returns up to limit of the newest records, oldest first (limit <= 0:
// all kept).
func (r *recordRing) list(limit int) []api.EgressRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []api.EgressRecord
	if r.full {
		out = append(out, r.buf[r.next:]...)
	}
	out = append(out, r.buf[:r.next]...)
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}
