package replay

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Recorded is one foreground run read from a flight record.
type Recorded struct {
	api.RunSummary
	// Started is its run.started's time; Credentials the names of the
	// secrets it was given.
	Started     time.Time
	Credentials []string
}

// Runs reads the foreground runs of a sandbox's events (oldest first),
// each with its end and its effects, in the order they started.
// Background runs, and events of no run, are left out.
func Runs(evs []api.SandboxEvent) []Recorded {
	var out []Recorded
	at := map[string]int{}
	for _, ev := range evs {
		if ev.RunID == "" {
			continue
		}
		if ev.Type == api.EventRunStarted {
			if ev.Run == nil || ev.Run.Mode == "background" {
				continue
			}
			at[ev.RunID] = len(out)
			out = append(out, Recorded{
				RunSummary: api.RunSummary{Run: ev.RunID, Seq: ev.Seq, Command: ev.Run.Command, Args: ev.Run.Args, Cwd: ev.Run.Cwd, User: ev.Run.User},
				Started:    ev.Time, Credentials: ev.Run.Credentials,
			})
			continue
		}
		i, ok := at[ev.RunID]
		if !ok {
			continue
		}
		s := &out[i].RunSummary
		switch {
		case ev.Type == api.EventRunEnded && ev.Run != nil:
			s.Outcome, s.ExitCode, s.Signal = ev.Run.Outcome, ev.Run.ExitCode, ev.Run.Signal
			s.OutputBytes, s.OutputSHA256 = ev.Run.OutputBytes, ev.Run.OutputSHA256
			s.FilesIncomplete = ev.Run.FilesOmitted > 0 || ev.Run.FilesTruncated
		case ev.File != nil:
			s.Files = append(s.Files, *ev.File)
		case ev.Package != nil:
			s.Packages = append(s.Packages, *ev.Package)
		}
	}
	return out
}

// Differences says how b differs from a, the original: its outcome (exit
// code, signal), its output digest, its file effects (by path, ignoring
// paths under the ignore prefixes) and its packages. Empty when they
// match.
func Differences(a, b api.RunSummary, ignore []string) []string {
	var d []string
	add := func(format string, args ...any) {
		if len(d) < maxDifferences {
			d = append(d, fmt.Sprintf(format, args...))
		}
	}
	if ea, eb := exitText(a), exitText(b); ea != eb {
		add("exit: %s, then %s", ea, eb)
	}
	if a.OutputSHA256 != b.OutputSHA256 {
		add("output: %d bytes sha256 %s, then %d bytes sha256 %s", a.OutputBytes, short(a.OutputSHA256), b.OutputBytes, short(b.OutputSHA256))
	}
	fa, fb := fileIndex(a.Files, ignore), fileIndex(b.Files, ignore)
	paths := make([]string, 0, len(fa)+len(fb))
	for p := range fa {
		paths = append(paths, p)
	}
	for p := range fb {
		if _, ok := fa[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	for _, p := range paths {
		x, inA := fa[p]
		y, inB := fb[p]
		switch {
		case !inB:
			add("file %s: %s, then unchanged", p, x.Change)
		case !inA:
			add("file %s: unchanged, then %s", p, y.Change)
		default:
			if w := fileDiff(x, y); w != "" {
				add("file %s: %s", p, w)
			}
		}
	}
	pa, pb := pkgSet(a.Packages), pkgSet(b.Packages)
	for _, k := range sortedKeys(pa) {
		if !pb[k] {
			add("package %s, then not", k)
		}
	}
	for _, k := range sortedKeys(pb) {
		if !pa[k] {
			add("no package %s, then it", k)
		}
	}
	return d
}

func exitText(s api.RunSummary) string {
	switch {
	case s.Outcome == "":
		return "no end recorded"
	case s.Signal != "":
		return s.Outcome + " (SIG" + s.Signal + ")"
	case s.ExitCode != nil:
		return fmt.Sprintf("%s (status %d)", s.Outcome, *s.ExitCode)
	}
	return s.Outcome
}

func short(h string) string {
	if h == "" {
		return "-"
	}
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func fileIndex(fs []api.FileEvent, ignore []string) map[string]api.FileEvent {
	m := map[string]api.FileEvent{}
	for _, f := range fs {
		if ignored(f.Path, ignore) {
			continue
		}
		m[f.Path] = f
	}
	return m
}

func ignored(p string, ignore []string) bool {
	for _, pre := range ignore {
		if pre != "" && (p == strings.TrimSuffix(pre, "/") || strings.HasPrefix(p, pre) || strings.HasPrefix(p, strings.TrimSuffix(pre, "/")+"/")) {
			return true
		}
	}
	return false
}

// fileDiff compares one path's change in two runs. Created and modified
// count as the same (the fork's writable layer starts empty where the
// original's held earlier changes: a file the original had created and
// rewrites is a copy-up in the fork).
func fileDiff(x, y api.FileEvent) string {
	del := func(f api.FileEvent) bool { return f.Change == "deleted" }
	switch {
	case del(x) != del(y):
		return x.Change + ", then " + y.Change
	case del(x):
		return ""
	case x.Kind != y.Kind:
		return x.Kind + ", then " + y.Kind
	case x.SHA256 != y.SHA256:
		return fmt.Sprintf("content sha256 %s, then %s", short(x.SHA256), short(y.SHA256))
	case x.Target != y.Target:
		return "link target differs"
	case x.Mode != y.Mode:
		return "mode " + x.Mode + ", then " + y.Mode
	case x.SHA256 == "" && x.Kind == "file" && x.Size != y.Size:
		return fmt.Sprintf("size %d, then %d", x.Size, y.Size)
	}
	return ""
}

func pkgSet(ps []api.PackageEvent) map[string]bool {
	m := map[string]bool{}
	for _, p := range ps {
		m[p.Action+" "+p.Manager+":"+p.Name+"="+p.Version] = true
	}
	return m
}

func sortedKeys(m map[string]bool) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}
