// Command bench measures agentbox against its peers and the physical floor
// of sandbox creation and exec on this machine, and prints medians, p90s
// and ratios taken in the same run. With -write it also rewrites
// docs/BENCHMARKS.md with the results and a description of the machine.
//
// It uses only public tools (runc, crun, unshare, nsenter, busybox) and
// must run as root from the repository (make bench). Everything it creates
// is removed by id or pid when it ends.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	if err := mainErr(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func mainErr() error {
	var (
		n        = flag.Int("n", 30, "timed runs per measurement (at least 30 for a publishable median and p90)")
		warmup   = flag.Int("warmup", 3, "untimed warm-up runs before the timed ones")
		write    = flag.Bool("write", false, "rewrite the results document (-doc)")
		doc      = flag.String("doc", "docs/BENCHMARKS.md", "results document, relative to the repository root")
		bin      = flag.String("bin", "bin/agentbox", "agentbox binary, relative to the repository root; built when missing")
		dataDir  = flag.String("data-dir", "", "directory for the benchmark daemon's data, socket and log (default: a fresh temp dir, removed afterwards)")
		template = flag.String("template", "busybox", "template the agentbox sandboxes are created from")
		buildTO  = flag.Duration("build-timeout", 10*time.Minute, "limit for building the template before measuring")
		peers    = flag.Bool("peers", true, "measure the peers (runc, crun, unshare, nsenter, floor)")
		agentbox = flag.Bool("agentbox", true, "measure agentbox")
		core     = flag.Bool("core", true, "with -agentbox: measure create→first exec and the exec round trip")
		egressB  = flag.Bool("egress", true, "measure the egress proxy (needs -agentbox's binary)")
		poolB    = flag.Bool("pool", true, "measure warm-pool claims (needs -agentbox's binary; with -gvisor, from a gvisor pool too)")
		svcB     = flag.Bool("serviceurl", true, "measure the service URL proxy against the same request from inside (needs -agentbox's binary)")
		gvisorB  = flag.Bool("gvisor", true, "measure runsc run and agentbox on its gvisor backend (needs runsc: scripts/install-deps.sh)")
		gvMem    = flag.Bool("gvisor-memory", true, "with -gvisor: memory checkpoint, restore and fork ×10 of a python3 process holding 50 MB (builds the debian template: mmdebstrap)")
		scale    = flag.Bool("scale", false, "measure density (-scale-n paused sandboxes, minutes), wake, creates/s at concurrency 16 and noisy neighbours (needs -agentbox's binary)")
		scaleN   = flag.Int("scale-n", 1000, "paused sandboxes for the density measurement")
		parts    = flag.String("scale-parts", "noisy,rate,density", "which -scale measurements to run, comma-separated: noisy (exec next to CPU-burning neighbours), rate (creates/s at concurrency 16), density (memory per paused sandbox, resume and wake)")
	)
	flag.Parse()
	if *n < 1 || *warmup < 0 {
		return fmt.Errorf("-n must be ≥ 1 and -warmup ≥ 0")
	}
	if *n < 30 {
		fmt.Fprintf(os.Stderr, "bench: note: -n %d < 30; medians and p90s are rough\n", *n)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root (namespaces, runc, crun, the daemon)")
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tmp, err := os.MkdirTemp("", "agentbox-bench-peers-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b := &bench{n: *n, warmup: *warmup, bundle: filepath.Join(tmp, "true-bundle"), prefix: fmt.Sprintf("abbench-%d", os.Getpid())}

	var (
		results []result
		extra   []ratioLine
	)
	if *peers {
		results = append(results, measurePeers(ctx, b, tmp)...)
	}
	if *agentbox {
		abin := filepath.Join(root, *bin)
		if filepath.IsAbs(*bin) {
			abin = *bin
		}
		if err := ensureBinary(ctx, root, abin); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		if *core {
			results = append(results, measureAgentbox(ctx, b, abin, *dataDir, *template, *buildTO)...)
		}
		if *egressB {
			results = append(results, measureEgress(ctx, b, root, abin, *template, *buildTO)...)
		}
		if *poolB {
			results = append(results, measurePool(ctx, b, abin, *template, *buildTO, *gvisorB)...)
		}
		if *svcB {
			results = append(results, measureServiceURL(ctx, b, root, abin, *template, *buildTO)...)
		}
		if *gvisorB {
			if err := makeBundle(ctx, b.bundle, []string{"/bin/true"}); err != nil && !errors.Is(err, os.ErrExist) {
				fmt.Fprintln(os.Stderr, "bench: bundle:", err)
			}
			results = append(results, measureGvisor(ctx, b, tmp, abin, *template, *buildTO)...)
			if *gvMem {
				results = append(results, measureGvisorMemory(ctx, b, abin, *buildTO)...)
			}
		}
		if *scale {
			r, l := measureScale(ctx, b, abin, *template, *buildTO, *scaleN, scaleParts(*parts))
			results, extra = append(results, r...), append(extra, l...)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}

	lines := append(append(append(evalRatios(results), egressTargets(results)...), poolTargets(results)...), append(serviceTargets(results), extra...)...)
	printText(os.Stdout, results, lines)
	if *write {
		path := filepath.Join(root, *doc)
		md := markdown(describeMachine(), *n, *warmup, results, lines)
		if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nwrote %s\n", path)
	}
	return nil
}

// measurePeers runs every peer measurement. The creation peers run first:
// crun's measurement throws away its OS thread, and nothing that depends on
// the thread that spawned it (Pdeathsig) may be started before it.
func measurePeers(ctx context.Context, b *bench, tmp string) []result {
	var results []result
	say := func(r result) {
		status := "ok"
		if r.Skip != "" {
			status = "skipped: " + firstLine(r.Skip)
		}
		fmt.Fprintf(os.Stderr, "bench: %-20s %s\n", r.Key, status)
		results = append(results, r)
	}
	bundleErr := makeBundle(ctx, b.bundle, []string{"/bin/true"})
	say(measureFloor(ctx, b))
	say(measureUnshare(ctx, b))
	if bundleErr != nil {
		say(skipped(keyRuncRun, groupCreate, "runc run", "making bundle: "+bundleErr.Error()))
		say(skipped(keyCrunRun, groupCreate, "crun run", "making bundle: "+bundleErr.Error()))
	} else {
		say(measureRuncRun(ctx, b))
		say(measureCrunRun(ctx, b, false))
		say(measureCrunRun(ctx, b, true))
	}
	say(measureForkExec(ctx, b))
	say(measureRuncExec(ctx, b, tmp))
	say(measureNsenter(ctx, b))
	return results
}

// repoRoot finds the directory holding go.mod, from the working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run from inside the agentbox repository (no go.mod above the working directory)")
		}
		dir = parent
	}
}

// ensureBinary builds the static agentbox binary when it is missing.
func ensureBinary(ctx context.Context, root, bin string) error {
	if _, err := os.Stat(bin); err == nil {
		return nil
	}
	fmt.Fprintf(os.Stderr, "bench: building %s\n", bin)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/agentbox")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s: %w", bin, err)
	}
	return nil
}
