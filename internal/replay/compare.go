package replay

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// MaxCompareRuns bounds the runs compared per sandbox.
const MaxCompareRuns = 1000

// Compare puts sandboxes a and b side by side: their foreground runs
// paired in record order (the first pair that differs, or a run on one
// side only, is the first divergence) and the diff of their files from a
// to b (the checkpoint feature's Diff, identity files left out). Either
// may be deleted while its record is kept (then the diff fails:
// ErrNotFound). Errors: ErrNotFound for a sandbox the caller cannot see.
func (r *Replayer) Compare(ctx context.Context, a, b string) (api.CompareResult, error) {
	if a == "" || b == "" {
		return api.CompareResult{}, fmt.Errorf("compare: two sandboxes are required: %w", errdefs.ErrInvalidArgument)
	}
	var sides [2][]Recorded
	for i, id := range []string{a, b} {
		evs, err := r.events.Events(ctx, id, api.EventQuery{Limit: maxEvents})
		if err != nil {
			return api.CompareResult{}, fmt.Errorf("compare: %w", err)
		}
		sides[i] = Runs(evs)
		if len(sides[i]) > MaxCompareRuns {
			sides[i] = sides[i][:MaxCompareRuns]
		}
	}
	diff, err := r.snaps.Diff(ctx, "sandbox:"+a, "sandbox:"+b, api.DiffOptions{})
	if err != nil {
		return api.CompareResult{}, fmt.Errorf("compare: %w", err)
	}
	res := api.CompareResult{A: a, B: b, Steps: []api.CompareStep{}, Diff: diff}
	n := max(len(sides[0]), len(sides[1]))
	for i := range n {
		st := api.CompareStep{Index: i}
		if i < len(sides[0]) {
			st.A = &sides[0][i].RunSummary
		}
		if i < len(sides[1]) {
			st.B = &sides[1][i].RunSummary
		}
		switch {
		case st.A == nil:
			st.Differences = []string{"run only in " + b}
		case st.B == nil:
			st.Differences = []string{"run only in " + a}
		default:
			if st.A.Command != st.B.Command || !slices.Equal(st.A.Args, st.B.Args) {
				st.Differences = append(st.Differences, fmt.Sprintf("command %q, then %q", clipText(st.A.Command), clipText(st.B.Command)))
			}
			st.Differences = append(st.Differences, Differences(*st.A, *st.B, nil)...)
		}
		st.Diverged = len(st.Differences) > 0
		if st.Diverged && !res.Diverged {
			res.Diverged, res.FirstDivergence = true, &st.Index
		}
		res.Steps = append(res.Steps, st)
	}
	return res, nil
}

func clipText(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Report is sandbox id's recorded run: its command, end and effects
// (the artifact API's run report). ErrNotFound for a run not in the
// record as a foreground run.
func (r *Replayer) Report(ctx context.Context, id, run string) (api.RunSummary, error) {
	evs, err := r.events.Events(ctx, id, api.EventQuery{Run: run, Limit: maxEvents})
	if err != nil {
		return api.RunSummary{}, fmt.Errorf("run report: %w", err)
	}
	for _, s := range Runs(evs) {
		if s.Run == run {
			return s.RunSummary, nil
		}
	}
	return api.RunSummary{}, fmt.Errorf("run %s of sandbox %s: %w", run, id, errdefs.ErrNotFound)
}
