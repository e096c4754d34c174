package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"time"
)

// What the measurements against a private daemon share (egress.go,
// serviceurl.go): collecting results, building a helper program and
// installing it in a sandbox, and targets on the difference of two
// medians.

// collector gathers a measurement's results, telling stderr of each as it
// comes.
type collector []result

func (c *collector) add(r result) {
	st := "ok"
	if r.Skip != "" {
		st = "skipped: " + firstLine(r.Skip)
	}
	fmt.Fprintf(os.Stderr, "bench: %-20s %s\n", r.Key, st)
	*c = append(*c, r)
}

// goBuild builds the Go package pkg (a path relative to root, the
// repository: "./bench/egressclient") as a static binary out.
func goBuild(ctx context.Context, root, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v: %s", pkg, err, o)
	}
	return nil
}

// install copies the host file src into sandbox id as the executable path
// (mode 0755), making its parent directories.
func (d *daemon) install(ctx context.Context, id, src, path string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return d.raw(ctx, http.MethodPut, "/v1/sandboxes/"+id+"/files?mode=0755&parents=true&path="+url.QueryEscape(path), b, http.StatusOK)
}

// buildTemplateWithin is buildTemplate given at most timeout.
func (d *daemon) buildTemplateWithin(ctx context.Context, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return d.buildTemplate(ctx, name)
}

// measuredByKey indexes by key the results that were measured: not
// skipped, with samples.
func measuredByKey(results []result) map[string]result {
	by := map[string]result{}
	for _, r := range results {
		if r.Skip == "" && r.N > 0 {
			by[r.Key] = r
		}
	}
	return by
}

// addedLatency evaluates r on the difference of medians, median(Num) −
// median(Den) in milliseconds: what the path of Num adds to that of Den.
// Its status is "info" without a Target, else met or MISSED as for a
// ratio; "not measured" unless both were measured.
func addedLatency(results []result, r ratio) ratioLine {
	l := ratioLine{ratio: r}
	by := measuredByKey(results)
	num, okN := by[r.Num]
	den, okD := by[r.Den]
	if !okN || !okD {
		l.Status = "not measured"
		return l
	}
	l.Value = float64(num.Median-den.Median) / float64(time.Millisecond)
	switch {
	case r.Target == 0:
		l.Status = "info"
	case r.Max:
		l.Status = status(l.Value <= r.Target)
	default:
		l.Status = status(l.Value >= r.Target)
	}
	return l
}
