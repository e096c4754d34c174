package main

import (
	"math"
	"testing"
	"time"
)

// The egress and service URL targets: the difference of two medians in
// ms, met or missed against the target, "info" without one, and "not
// measured" when either side is missing, skipped or without samples.
func TestAddedLatencyTargets(t *testing.T) {
	ms := time.Millisecond
	results := []result{
		row(keyEgressDirect, groupEgress, 2*ms),
		row(keyEgressIntercept, groupEgress, 2*ms+500*time.Microsecond), // +0.5 ≤ 1: met
		row(keyEgressTunnelled, groupEgress, 5*ms),                      // +3: info
		row(keyEgressStream, groupEgress, 100*ms),                       // 64 MiB in 0.1 s = 671 MB/s ≥ 500: met
		row(keyServiceInside, groupService, 1*ms),
		row(keyServiceProxy, groupService, 3*ms), // +2 > 1: missed
	}
	check := func(name string, l ratioLine, status string, value float64) {
		t.Helper()
		if l.Status != status || math.Abs(l.Value-value) > 1e-9 {
			t.Errorf("%s: %q %g, want %q %g", name, l.Status, l.Value, status, value)
		}
	}
	eg := egressTargets(results)
	if len(eg) != 3 {
		t.Fatalf("egressTargets: %d lines", len(eg))
	}
	check("intercepted", eg[0], "met", 0.5)
	check("tunnelled", eg[1], "info", 3)
	check("throughput", eg[2], "met", float64(egressStreamBytes)/1e6/0.1)
	check("service", serviceTargets(results)[0], "MISSED", 2)

	// Below the target when it is a minimum.
	check("minimum", addedLatency(results, ratio{Num: keyEgressTunnelled, Den: keyEgressDirect, Target: 5}), "MISSED", 3)

	results[0].Skip = "no network"
	results[4].N = 0
	for i, l := range append(egressTargets(results)[:2], serviceTargets(results)...) {
		check("unmeasured "+l.Label, l, "not measured", 0)
		if i == 2 && l.Num != keyServiceProxy {
			t.Errorf("service line for %s", l.Num)
		}
	}
	if l := egressTargets(results[1:])[2]; l.Status != "met" {
		t.Errorf("throughput without the direct row: %q", l.Status)
	}
	if l := egressTargets(nil)[2]; l.Status != "not measured" {
		t.Errorf("throughput of nothing: %q", l.Status)
	}
}
