package testutil

import (
	"fmt"
	"slices"
	"sync"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// AdmitRecorder fakes a quota's admission of a new layer: it records every
// call as "subject layer", refuses while told to (ErrResourceExhausted with
// a Retry-After), and at each release records "LABEL recorded=BOOL", where
// Recorded reports whether the admitted object's record exists by then
// (admission must happen before the record is written, release after).
// Safe for concurrent use.
type AdmitRecorder struct {
	// Recorded is called at release; Label names the object in
	// Released (default: the layer).
	Recorded func(subject, layer string) bool
	Label    func(subject, layer string) string

	// mu guards the fields below.
	mu       sync.Mutex
	refuse   bool
	asked    []string
	released []string
}

// Admit admits layer for subject, or refuses it.
func (a *AdmitRecorder) Admit(subject, layer string) (func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, subject+" "+layer)
	if a.refuse {
		return nil, errdefs.WithRetryAfter(fmt.Errorf("%s is over its disk quota: %w", subject, errdefs.ErrResourceExhausted), 10)
	}
	return func() {
		recorded := a.Recorded(subject, layer)
		label := layer
		if a.Label != nil {
			label = a.Label(subject, layer)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.released = append(a.released, fmt.Sprintf("%s recorded=%v", label, recorded))
	}, nil
}

// Reset forgets the calls so far and sets whether to refuse.
func (a *AdmitRecorder) Reset(refuse bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refuse, a.asked, a.released = refuse, nil, nil
}

// Calls returns the admissions asked for and the releases, in order.
func (a *AdmitRecorder) Calls() (asked, released []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asked), slices.Clone(a.released)
}
