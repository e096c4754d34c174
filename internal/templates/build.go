package templates

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
)

// Build builds the template named by req (a builtin or registered name, or
// a full spec, which is registered first) and returns it.
//
// progress (may be nil) receives one "step" event per step (Cached set when
// the step's result came from the cache), "log" events for output lines
// (mmdebstrap, run steps, base template builds) and, on success, a final
// "done" event. On failure Build returns the error and sends no error event:
// the caller reports it. progress is called from one goroutine at a time.
//
// Concurrent builds of the same spec share one build; it is cancelled only
// when every caller's ctx is done. With req.Force the steps of this spec are
// re-executed even when cached (its base template is not rebuilt).
func (m *Manager) Build(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (Template, error) {
	if progress == nil {
		progress = func(api.BuildEvent) {}
	}
	spec, err := m.resolveRequest(ctx, req)
	if err != nil {
		return Template{}, err
	}
	t, _, err := m.buildShared(ctx, spec, req.Force, progress)
	if err != nil {
		return Template{}, err
	}
	a := t.API()
	progress(api.BuildEvent{Type: api.BuildEventDone, Template: &a})
	return t, nil
}

func (m *Manager) resolveRequest(ctx context.Context, req api.BuildTemplateRequest) (api.TemplateSpec, error) {
	var spec api.TemplateSpec
	switch {
	case req.Spec != nil:
		if req.Name != "" && req.Name != req.Spec.Name {
			return spec, fmt.Errorf("build request names %q but its spec %q: %w", req.Name, req.Spec.Name, errdefs.ErrInvalidArgument)
		}
		if err := m.Register(ctx, *req.Spec); err != nil {
			return spec, err
		}
		spec = *req.Spec
	case req.Name != "":
		m.mu.Lock()
		s, ok := lookupSpec(m.specs, req.Name)
		m.mu.Unlock()
		if !ok {
			return spec, fmt.Errorf("template %q: %w", req.Name, errdefs.ErrNotFound)
		}
		spec = s
	default:
		return spec, fmt.Errorf("build request needs a name or a spec: %w", errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return spec, checkChain(m.specs, spec.Name)
}

// flight is one running build shared by every caller asking for it.
type flight struct {
	ctx    context.Context // the build's; cancelled when the last caller leaves
	done   chan struct{}
	cancel context.CancelFunc
	tmpl   Template // set before done is closed
	res    buildResult
	err    error

	// mu guards the fields below; held while events are delivered.
	mu      sync.Mutex
	subs    map[int]func(api.BuildEvent)
	nextSub int
}

func (f *flight) emit(ev api.BuildEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(f.subs)) {
		f.subs[id](ev)
	}
}

// buildResult is what a finished build tells a template built on top of it.
type buildResult struct {
	key    string // final cache key
	cached bool   // nothing was executed
}

func (m *Manager) buildShared(ctx context.Context, spec api.TemplateSpec, force bool, progress func(api.BuildEvent)) (Template, buildResult, error) {
	sj, _ := json.Marshal(spec)
	key := fmt.Sprintf("%s\x00%t", sj, force)

	m.fmu.Lock()
	f, running := m.flights[key]
	if !running {
		// The build outlives any single caller; it is cancelled when the
		// last one leaves.
		bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{ctx: bctx, done: make(chan struct{}), cancel: cancel, subs: map[int]func(api.BuildEvent){}}
		m.flights[key] = f
	}
	f.mu.Lock()
	sub := f.nextSub
	f.nextSub++
	f.subs[sub] = progress
	f.mu.Unlock()
	m.fmu.Unlock()
	if !running { // started only now, so the first caller sees every event
		go func() {
			f.tmpl, f.res, f.err = m.build(f.ctx, spec, force, f.emit)
			m.fmu.Lock()
			if m.flights[key] == f {
				delete(m.flights, key)
			}
			m.fmu.Unlock()
			f.cancel()
			close(f.done)
		}()
	}

	select {
	case <-f.done:
		t := f.tmpl
		t.Env, t.Layers = maps.Clone(t.Env), slices.Clone(t.Layers)
		return t, f.res, f.err
	case <-ctx.Done():
	}
	m.fmu.Lock()
	f.mu.Lock()
	delete(f.subs, sub)
	last := len(f.subs) == 0
	f.mu.Unlock()
	if last {
		f.cancel()
		if m.flights[key] == f {
			delete(m.flights, key) // a new caller starts afresh
		}
	}
	m.fmu.Unlock()
	return Template{}, buildResult{}, fmt.Errorf("building template %s: %w", spec.Name, ctx.Err())
}

// stage is the state of a build between steps.
type stage struct {
	key   string
	layer string
	env   map[string]string
}

// build runs one build of spec. It registers the template only on success.
func (m *Manager) build(ctx context.Context, spec api.TemplateSpec, force bool, emit func(api.BuildEvent)) (Template, buildResult, error) {
	start := time.Now()
	total := 1 + len(spec.Steps)
	allCached := true
	step := func(n int, msg string, cached bool) {
		allCached = allCached && cached
		emit(api.BuildEvent{Type: api.BuildEventStep, Step: n, Steps: total, Message: msg, Cached: cached})
	}
	logw := newLineWriter(func(line string) { emit(api.BuildEvent{Type: api.BuildEventLog, Message: line}) })
	defer logw.Flush()

	st, err := m.buildBase(ctx, spec, force, step, emit, logw)
	if err != nil {
		return Template{}, buildResult{}, fmt.Errorf("building template %s: step 1 (base %s): %w", spec.Name, spec.Base, err)
	}
	for i, s := range spec.Steps {
		if err := ctx.Err(); err != nil {
			return Template{}, buildResult{}, fmt.Errorf("building template %s: %w", spec.Name, err)
		}
		if st, err = m.runStep(ctx, st, s, i+2, force, allCached, step, logw); err != nil {
			return Template{}, buildResult{}, fmt.Errorf("building template %s: step %d: %w", spec.Name, i+2, err)
		}
		logw.Flush()
	}

	env := maps.Clone(st.env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, spec.Env)
	envJSON, _ := json.Marshal(spec.Env)
	res := buildResult{key: hashStrings(st.key, "final", string(envJSON)), cached: allCached}

	m.mu.Lock()
	old, had := m.records[spec.Name]
	m.mu.Unlock()
	if had && old.Key == res.key && old.Layer == st.layer && specEqual(old.Spec, spec) {
		if t, err := m.resolve(old); err == nil {
			t.key = res.key
			return t, res, nil
		}
	}
	r := record{Name: spec.Name, Key: res.key, Layer: st.layer, Env: env, Spec: spec, CreatedAt: time.Now().UTC()}
	if err := m.saveRecord(ctx, r); err != nil {
		return Template{}, buildResult{}, err
	}
	t, err := m.resolve(r)
	if err != nil {
		return Template{}, buildResult{}, err
	}
	t.key = res.key
	m.log.Info("template built", "template", spec.Name, "id", t.ID, "cached", allCached, "duration", time.Since(start))
	return t, res, nil
}

func (m *Manager) buildBase(ctx context.Context, spec api.TemplateSpec, force bool, step func(int, string, bool), emit func(api.BuildEvent), logw *lineWriter) (stage, error) {
	b, err := parseBase(spec.Base)
	if err != nil {
		return stage{}, err
	}
	var key string
	switch b.kind {
	case baseTemplate:
		m.mu.Lock()
		bspec, ok := lookupSpec(m.specs, b.template)
		m.mu.Unlock()
		if !ok {
			return stage{}, fmt.Errorf("base template %q: %w", b.template, errdefs.ErrNotFound)
		}
		bt, res, err := m.buildShared(ctx, bspec, false, func(ev api.BuildEvent) {
			if ev.Type == api.BuildEventStep || ev.Type == api.BuildEventLog {
				emit(api.BuildEvent{Type: api.BuildEventLog, Message: b.template + ": " + ev.Message})
			}
		})
		if err != nil {
			return stage{}, err
		}
		// After the base's own progress (forwarded as log lines), when
		// it is known whether it came from the cache.
		step(1, "FROM "+b.template, res.cached)
		return stage{key: hashStrings("base", "template", res.key), layer: bt.ID, env: bt.Env}, nil
	case baseBusybox:
		if key, err = m.busyboxKey(); err != nil {
			return stage{}, err
		}
	case baseDebian:
		key = m.debianKey(b)
	}
	if e, ok := m.cached(key); ok && !force {
		step(1, "FROM "+b.String(), true)
		return stage{key: key, layer: e.Layer}, nil
	}
	step(1, "FROM "+b.String(), false)
	var l layers.Layer
	if b.kind == baseBusybox {
		l, err = m.buildBusybox(ctx)
	} else {
		l, err = m.buildDebian(ctx, b, logw)
	}
	if err != nil {
		return stage{}, err
	}
	m.storeCache(key, cacheEntry{Layer: l.ID})
	return stage{key: key, layer: l.ID}, nil
}

// runStep applies step n to st. chainCached tells whether every earlier step
// came from the cache (an env step then counts as cached too).
func (m *Manager) runStep(ctx context.Context, st stage, s api.TemplateStep, n int, force, chainCached bool, step func(int, string, bool), logw *lineWriter) (stage, error) {
	sj, err := json.Marshal(s)
	if err != nil {
		return st, err
	}
	switch {
	case s.Env != nil:
		st.key = hashStrings(st.key, "env", string(sj))
		st.env = maps.Clone(st.env)
		if st.env == nil {
			st.env = map[string]string{}
		}
		maps.Copy(st.env, s.Env)
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			kv = append(kv, k+"="+s.Env[k])
		}
		step(n, "ENV "+strings.Join(kv, " "), chainCached)
		return st, nil

	case s.Copy != nil:
		// The copy is cheap and its content is part of the key: always do
		// it; an unchanged copy yields the very same layer.
		l, err := m.cfg.Layers.ImportPath(ctx, s.Copy.Src, s.Copy.Dst, layers.CreateOptions{Parent: st.layer})
		if err != nil {
			return st, err
		}
		key := hashStrings(st.key, "copy", string(sj), l.Digest)
		_, hit := m.cached(key)
		step(n, fmt.Sprintf("COPY %s %s", s.Copy.Src, s.Copy.Dst), hit && !force)
		m.storeCache(key, cacheEntry{Layer: l.ID})
		st.key, st.layer = key, l.ID
		return st, nil

	default:
		key := hashStrings(st.key, "run", string(sj))
		msg := "RUN " + oneLine(s.Run)
		if e, ok := m.cached(key); ok && !force {
			step(n, msg, true)
			st.key, st.layer = key, e.Layer
			return st, nil
		}
		step(n, msg, false)
		layer, err := m.execRun(ctx, st, s.Run, logw)
		if err != nil {
			return st, err
		}
		m.storeCache(key, cacheEntry{Layer: layer})
		st.key, st.layer = key, layer
		return st, nil
	}
}

// execRun runs command through the StepRunner on top of st and returns the
// resulting top layer (st.layer itself when the command changed nothing).
func (m *Manager) execRun(ctx context.Context, st stage, command string, logw *lineWriter) (string, error) {
	if m.cfg.Runner == nil {
		return "", fmt.Errorf("run steps need a step runner: %w", errdefs.ErrFailedPrecondition)
	}
	paths, err := m.cfg.Layers.Paths(st.layer)
	if err != nil {
		return "", err
	}
	scratch, release, err := m.stepScratch(ctx)
	if err != nil {
		return "", err
	}
	defer release()
	upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return "", err
		}
		if err := os.Lchown(d, int(m.cfg.IDs.HostID), int(m.cfg.IDs.HostID)); err != nil {
			return "", err
		}
	}
	if err := m.cfg.Runner.RunStep(ctx, paths, upper, maps.Clone(st.env), command, logw); err != nil {
		return "", fmt.Errorf("RUN %s: %w", oneLine(command), err)
	}
	logw.Flush()
	ents, err := os.ReadDir(upper)
	if err != nil {
		return "", err
	}
	if len(ents) == 0 {
		return st.layer, nil // nothing changed: no empty layer
	}
	l, err := m.cfg.Layers.CreateFromDir(ctx, upper, layers.CreateOptions{Parent: st.layer})
	if err != nil {
		return "", err
	}
	return l.ID, nil
}

// stepScratch returns a fresh dir for a run step's upper and work dirs:
// the Runner's, capped, when it is a StepScratcher, else a scratch dir of
// the layer store.
func (m *Manager) stepScratch(ctx context.Context) (string, func(), error) {
	if sc, ok := m.cfg.Runner.(StepScratcher); ok {
		return sc.StepScratch(ctx)
	}
	dir, err := m.cfg.Layers.TempDir("step-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// lineWriter turns written bytes into lines passed to emit. Safe for
// concurrent use.
type lineWriter struct {
	emit func(string)

	// mu guards buf.
	mu  sync.Mutex
	buf bytes.Buffer
}

const maxLine = 16 << 10

func newLineWriter(emit func(string)) *lineWriter { return &lineWriter{emit: emit} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		b := w.buf.Bytes()
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(b) >= maxLine {
				w.emit(string(b))
				w.buf.Reset()
			}
			return len(p), nil
		}
		w.emit(strings.TrimRight(string(b[:i]), "\r"))
		w.buf.Next(i + 1)
	}
}

// Flush emits a pending partial line.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.emit(w.buf.String())
		w.buf.Reset()
	}
}
