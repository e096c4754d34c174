package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func templateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "List and build templates",
	}
	cmd.AddCommand(templateLsCmd(g), templateBuildCmd(g), templateSaveCmd(g), templateVersionsCmd(g), templateExportCmd(g), templateImportCmd(g), templatePoolCmd(g))
	return cmd
}

func templateLsCmd(_ *globals) *cobra.Command {
	return lsCommand("List templates", listing[api.Template]{
		fetch:  noArgs((*agentbox.Client).Templates),
		header: "NAME\tBUILT\tBUILTIN\tSIZE\tID\tCREATED",
		row: func(t api.Template) string {
			size, created, id := "-", "-", "-"
			if t.SizeBytes > 0 {
				size = humanBytes(t.SizeBytes)
			}
			if t.CreatedAt != nil {
				created = humanDuration(time.Since(*t.CreatedAt)) + " ago"
			}
			if t.ID != "" {
				id = shortID(t.ID)
			}
			return fmt.Sprintf("%s\t%t\t%t\t%s\t%s\t%s", t.Name, t.Built, t.Builtin, size, id, created)
		},
	})
}

// shortID shortens a content hash for display: "sha256:0123456789ab".
func shortID(id string) string {
	algo, hex, ok := strings.Cut(id, ":")
	if !ok {
		algo, hex = "", id
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	if algo == "" {
		return hex
	}
	return algo + ":" + hex
}

func templateBuildCmd(g *globals) *cobra.Command {
	var file string
	var force bool
	cmd := &cobra.Command{
		Use:   "build NAME [--file spec.json] [--force]",
		Short: "Build a template, showing progress",
		Long: `Build the template NAME: a builtin or registered one, or the spec in
--file (JSON: {"base": "...", "steps": [{"run": "..."}, ...], "env": {...}}),
whose name becomes NAME.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.BuildTemplateRequest{Name: args[0], Force: force}
			if file != "" {
				spec, err := readSpec(file)
				if err != nil {
					return err
				}
				spec.Name = args[0]
				req = api.BuildTemplateRequest{Spec: spec, Force: force}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			_, tty := terminalFd(out)
			pr := newBuildProgress(out, tty)
			defer pr.stop()
			t, err := c.BuildTemplate(cmd.Context(), req, pr.event)
			pr.stop()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(out, t)
			}
			fmt.Fprintf(out, "built template %s (%s) in %s\n", t.Name, shortID(t.ID), time.Since(pr.start).Round(100*time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "template spec (JSON); - reads stdin")
	cmd.Flags().BoolVar(&force, "force", false, "rebuild even if cached")
	return cmd
}

func readSpec(file string) (*api.TemplateSpec, error) {
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("reading template spec: %w", err)
	}
	var spec api.TemplateSpec
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("parsing template spec %s: %w", file, err)
	}
	return &spec, nil
}

// buildProgress displays a build's events. Not on a terminal it prints one
// plain line per event ("[2/5] RUN ..." for steps, indented log lines). On
// a terminal each finished step stays as one line, and the current step,
// with a spinner, its elapsed time and its latest log line, is rewritten
// in place.
type buildProgress struct {
	w     io.Writer
	tty   bool
	start time.Time
	done  chan struct{}
	once  sync.Once

	// mu guards the fields below and writes to w.
	mu        sync.Mutex
	step      string // "[2/5] RUN make"
	stepStart time.Time
	last      string // latest log line of the step
	frame     int
	drawn     bool // a live line is on screen
}

var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func newBuildProgress(w io.Writer, tty bool) *buildProgress {
	p := &buildProgress{w: w, tty: tty, start: time.Now(), done: make(chan struct{})}
	if tty {
		go p.tick()
	}
	return p
}

func (p *buildProgress) tick() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.mu.Lock()
			p.frame++
			p.redrawLocked()
			p.mu.Unlock()
		}
	}
}

// stop ends the live display (idempotent).
func (p *buildProgress) stop() {
	p.once.Do(func() {
		close(p.done)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.finishStepLocked()
	})
}

func (p *buildProgress) event(ev api.BuildEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Type {
	case api.BuildEventStep:
		p.finishStepLocked()
		p.step = fmt.Sprintf("[%d/%d] %s", ev.Step, ev.Steps, ev.Message)
		if ev.Cached {
			p.step += " (cached)"
		}
		p.stepStart, p.last = time.Now(), ""
		if !p.tty {
			fmt.Fprintln(p.w, p.step)
		}
	case api.BuildEventLog:
		line := strings.TrimRight(ev.Message, "\r\n")
		if !p.tty {
			fmt.Fprintln(p.w, "      "+line)
			return
		}
		p.last = line
	}
	p.redrawLocked()
}

// finishStepLocked leaves the current step as a permanent line.
func (p *buildProgress) finishStepLocked() {
	if !p.tty || p.step == "" {
		return
	}
	p.clearLocked()
	fmt.Fprintf(p.w, "%s (%s)\n", p.step, time.Since(p.stepStart).Round(100*time.Millisecond))
	p.step = ""
}

func (p *buildProgress) clearLocked() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.drawn = false
	}
}

func (p *buildProgress) redrawLocked() {
	if !p.tty || p.step == "" {
		return
	}
	width := 80
	if fd, ok := terminalFd(p.w); ok {
		if w, _, err := term.GetSize(fd); err == nil && w > 20 {
			width = w
		}
	}
	line := fmt.Sprintf("%s %s %s", spinner[p.frame%len(spinner)], p.step, time.Since(p.stepStart).Round(time.Second))
	if p.last != "" {
		line += "  " + p.last
	}
	if r := []rune(line); len(r) > width-1 {
		line = string(r[:width-1])
	}
	p.clearLocked()
	fmt.Fprint(p.w, line)
	p.drawn = true
}
