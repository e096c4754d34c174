// Package idrange hands out per-sandbox host id ranges ("slots") from the
// daemon's subordinate id range (config uid_map_base/uid_map_size, by
// default the "agentbox" entries of /etc/subuid and /etc/subgid).
//
// The range is cut into slots of SlotSize ids. Slot 0 is the canonical
// range: every layer, upper and work dir is owned by it on disk, and no
// sandbox ever runs in it. Each sandbox (and each prespawned guest, build
// step, fork) runs in a slot of its own; the native backend shows it the
// canonical files through idmapped mounts. A process that escapes its
// sandbox holds that slot's host ids, which own no file anywhere and no
// other sandbox's processes.
//
// Slots are not persisted here: each sandbox's record carries its range,
// and a restarted daemon Adopts the ranges of the sandboxes it recovers
// before it Allocs new ones.
package idrange

import (
	"fmt"
	"sync"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// IDMap maps a contiguous range of ids inside a sandbox, starting at 0, to
// host ids starting at HostID. It lives here, in a leaf package, so that
// the packages that own files by id range (layers, templates) need not
// import the isolation backends' contract; IDMap is this type.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// SlotSize is the number of ids of one slot: a full 16-bit id space, as
// inside a sandbox uids 0..65535 exist (65534 is nobody).
const SlotSize = 1 << 16

// Allocator hands out slots. Safe for concurrent use.
type Allocator struct {
	base  uint32
	slots int // slot 0 included

	// mu guards the fields below.
	mu   sync.Mutex
	used map[int]bool // slot index -> in use; slot 0 never appears
	next int          // lowest slot that may be free
}

// New returns an allocator over the host ids base..base+size-1. It fails
// with errdefs.ErrInvalidArgument unless the range holds the canonical slot
// and at least one sandbox slot.
func New(base, size uint32) (*Allocator, error) {
	slots := int(size / SlotSize)
	if slots < 2 {
		return nil, fmt.Errorf("id range %d+%d holds %d slot(s) of %d ids; at least 2 are needed (the layers' canonical range and one sandbox): %w",
			base, size, slots, SlotSize, errdefs.ErrInvalidArgument)
	}
	if uint64(base)+uint64(slots)*SlotSize > 1<<32-1 {
		return nil, fmt.Errorf("id range %d+%d overflows 32-bit ids: %w", base, size, errdefs.ErrInvalidArgument)
	}
	if base == 0 {
		return nil, fmt.Errorf("id range %d+%d includes host root: %w", base, size, errdefs.ErrInvalidArgument)
	}
	return &Allocator{base: base, slots: slots, used: map[int]bool{}, next: 1}, nil
}

// Canonical is slot 0, the range files are owned by on disk.
func (a *Allocator) Canonical() IDMap { return IDMap{HostID: a.base, Size: SlotSize} }

// Capacity is the number of sandbox slots.
func (a *Allocator) Capacity() int { return a.slots - 1 }

func (a *Allocator) slot(i int) IDMap {
	return IDMap{HostID: a.base + uint32(i)*SlotSize, Size: SlotSize}
}

// index returns r's slot index, or an error unless r is exactly a sandbox
// slot of this allocator.
func (a *Allocator) index(r IDMap) (int, error) {
	if r.Size != SlotSize || r.HostID < a.base || (r.HostID-a.base)%SlotSize != 0 {
		return 0, fmt.Errorf("id range %d+%d is not a slot of %d+%d: %w", r.HostID, r.Size, a.base, uint64(a.slots)*SlotSize, errdefs.ErrInvalidArgument)
	}
	i := int((r.HostID - a.base) / SlotSize)
	if i == 0 || i >= a.slots {
		return 0, fmt.Errorf("id range %d+%d is not a sandbox slot of %d+%d: %w", r.HostID, r.Size, a.base, uint64(a.slots)*SlotSize, errdefs.ErrInvalidArgument)
	}
	return i, nil
}

// Alloc returns the lowest free slot (low slots are reused first, so the
// idmap user namespaces the backend keeps per slot stay few). It fails
// with errdefs.ErrResourceExhausted when every slot is in use.
func (a *Allocator) Alloc() (IDMap, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := a.next; i < a.slots; i++ {
		if !a.used[i] {
			a.used[i] = true
			a.next = i + 1
			return a.slot(i), nil
		}
	}
	return IDMap{}, fmt.Errorf("all %d sandbox id ranges are in use (uid_map_size %d): %w",
		a.slots-1, uint64(a.slots)*SlotSize, errdefs.ErrResourceExhausted)
}

// Adopt marks r in use: a recovered sandbox keeps its range. It fails with
// errdefs.ErrAlreadyExists when r is in use and errdefs.ErrInvalidArgument
// when r is not a sandbox slot of this allocator.
func (a *Allocator) Adopt(r IDMap) error {
	i, err := a.index(r)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used[i] {
		return fmt.Errorf("id range %d+%d: %w", r.HostID, r.Size, errdefs.ErrAlreadyExists)
	}
	a.used[i] = true
	return nil
}

// Release frees r. Call it only once no process runs in r and the files of
// its sandbox are gone. Releasing a free or foreign range does nothing.
func (a *Allocator) Release(r IDMap) {
	i, err := a.index(r)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used[i] {
		delete(a.used, i)
		a.next = min(a.next, i)
	}
}

// InUse is the number of slots handed out.
func (a *Allocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.used)
}
