// Package templates builds and keeps sandbox templates: an ordered stack of
// immutable layers (from package layers) plus a default environment.
//
// A template is described declaratively by an api.TemplateSpec: a base and
// steps. Bases:
//
//   - "busybox" (alias "scratch+busybox"): a tiny rootfs made from the host's
//     static busybox (Debian package busybox-static).
//   - "debian:SUITE[+PKG,PKG...]" (alias "debootstrap:SUITE[+...]"): Debian
//     minbase made by mmdebstrap, with the listed extra packages.
//   - the name of another template: its layers and env, with the steps on
//     top.
//
// Steps run in order: "run" executes a shell command in a throwaway sandbox
// (through the StepRunner) and keeps its upper directory as a new layer;
// "copy" copies a daemon-host path into a new layer; "env" sets variables for
// later steps and for sandboxes. The spec's own Env applies last, to
// sandboxes only.
//
// Builds are cached by content: each step's cache key is sha256 of the
// previous key and the step (and, for copy steps, the content hash of the
// copied files), so rebuilding an unchanged spec is instant. Concurrent
// builds of the same spec run once. A failed or cancelled build registers
// nothing (layers of the steps that did finish stay as cache).
//
// The registry (user specs, built templates, cache) lives in JSON files under
// Config.DataDir, written atomically; a restarted daemon sees the same
// templates. All Manager methods are safe for concurrent use.
package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/validate"
)

// StepRunner runs a shell command in a throwaway sandbox whose root is the
// given layers (top-most first) plus a fresh writable upper dir, and returns
// with the upper dir left in place (the caller turns it into a layer).
//
// upperDir and its sibling "work" directory exist, are empty and are owned by
// the mapped root when RunStep is called. output receives the command's
// stdout and stderr (it is safe for concurrent writes). A non-zero exit status
// is an error. RunStep must stop and return when ctx is cancelled, leaving no
// process behind.
type StepRunner interface {
	RunStep(ctx context.Context, layers []string, upperDir string, env map[string]string, command string, output io.Writer) error
}

// StepScratcher is a StepRunner that provides the directory a run step's
// upper and work dirs are made in, with its disk use capped (a disk
// quota), so a step cannot fill the host's disk.
type StepScratcher interface {
	// StepScratch returns a fresh, empty dir, and release, which removes
	// it and everything in it; the caller calls release once it is done
	// with the step's upper dir (made a layer, or failed).
	StepScratch(ctx context.Context) (dir string, release func(), err error)
}

// Config configures a Manager.
type Config struct {
	DataDir string        // registry directory (created if missing)
	Layers  *layers.Store // where template layers live
	IDs     runtime.IDMap // sandbox id map; must match Layers
	Runner  StepRunner    // runs "run" steps; nil: run steps fail with ErrFailedPrecondition; a StepScratcher caps their disk use
	Logger  *slog.Logger  // nil: discard
	// BusyboxPath is the static busybox binary used for the busybox base.
	// Default "/bin/busybox".
	BusyboxPath string
	// Mmdebstrap is the mmdebstrap binary for Debian bases. Default
	// "mmdebstrap" (looked up on PATH).
	Mmdebstrap string
	// DebianMirror is passed to mmdebstrap; empty means its default
	// (deb.debian.org).
	DebianMirror string
	// Admit, when set, is asked before template name (its stored name)
	// takes a new layer: the top of a build, an import (Adopt) or a saved
	// version. The layer exists and the template holds a reference on it
	// when Admit is called. An error refuses it: the reference is dropped,
	// nothing is registered and the operation fails with that error.
	// Otherwise release is called once the template's record is written
	// or has failed, without the Manager's locks held. See admit.go.
	Admit func(ctx context.Context, name, layer string) (release func(), err error)
}

// Template is a built template, ready to be stacked under a sandbox.
type Template struct {
	Name      string
	ID        string            // ID of the top layer: names the content of all layers
	Layers    []string          // host directories, top-most first
	Env       map[string]string // default environment of sandboxes
	Spec      api.TemplateSpec
	SizeBytes int64
	CreatedAt time.Time
	Builtin   bool

	key string // final build cache key, for templates built on this one
}

// API returns the wire form of t.
func (t Template) API() api.Template {
	created := t.CreatedAt
	return api.Template{Name: t.Name, ID: t.ID, Built: true, Builtin: t.Builtin, SizeBytes: t.SizeBytes, Env: maps.Clone(t.Env), CreatedAt: &created}
}

// Builtin returns the specs that exist without registration: "busybox",
// "debian" (bookworm with python3, python-is-python3 so that "python"
// runs it too, ca-certificates, curl, git) and "code-interpreter" (the
// debian template's packages plus numpy, pandas, matplotlib and Node.js,
// all from Debian, for the code interpreter of docs/CODE-INTERPRETER.md;
// matplotlib renders with its Agg backend).
func Builtin() []api.TemplateSpec {
	return []api.TemplateSpec{
		{Name: "busybox", Base: "busybox"},
		{Name: "debian", Base: "debian:bookworm+python3,python-is-python3,ca-certificates,curl,git", Env: map[string]string{"LANG": "C.UTF-8"}},
		{Name: CodeInterpreter, Base: "debian:bookworm+python3,python-is-python3,ca-certificates,curl,git,python3-numpy,python3-pandas,python3-matplotlib,nodejs", Env: map[string]string{"LANG": "C.UTF-8", "MPLBACKEND": "Agg"}},
	}
}

// CodeInterpreter is the name of the builtin template made for the code
// interpreter.
const CodeInterpreter = "code-interpreter"

// BuiltinSpec returns the builtin spec called name.
func BuiltinSpec(name string) (api.TemplateSpec, bool) { return builtin(name) }

func builtin(name string) (api.TemplateSpec, bool) {
	for _, s := range Builtin() {
		if s.Name == name {
			return s, true
		}
	}
	return api.TemplateSpec{}, false
}

// record is a built template as persisted under DataDir/templates.
type record struct {
	Name      string            `json:"name"`
	Key       string            `json:"key"`   // final cache key of the build
	Layer     string            `json:"layer"` // top layer ID
	Env       map[string]string `json:"env,omitempty"`
	Spec      api.TemplateSpec  `json:"spec"`
	CreatedAt time.Time         `json:"created_at"`
}

// Manager builds and keeps templates.
type Manager struct {
	cfg Config
	log *slog.Logger

	// mu guards specs and records, and the files they are persisted in.
	mu      sync.Mutex
	specs   map[string]api.TemplateSpec // registered user specs
	records map[string]record           // built templates

	// fmu guards flights.
	fmu     sync.Mutex
	flights map[string]*flight

	saved savedState // saved.go
}

// New opens the registry under cfg.DataDir.
func New(cfg Config) (*Manager, error) {
	if cfg.DataDir == "" || cfg.Layers == nil {
		return nil, fmt.Errorf("templates: DataDir and Layers are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.IDs.Size == 0 {
		cfg.IDs = cfg.Layers.IDs()
	}
	if cfg.IDs != cfg.Layers.IDs() {
		return nil, fmt.Errorf("templates: id map %+v differs from the layer store's %+v: %w", cfg.IDs, cfg.Layers.IDs(), errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.BusyboxPath == "" {
		cfg.BusyboxPath = "/bin/busybox"
	}
	if cfg.Mmdebstrap == "" {
		cfg.Mmdebstrap = "mmdebstrap"
	}
	m := &Manager{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "templates"),
		specs:   map[string]api.TemplateSpec{},
		records: map[string]record{},
		flights: map[string]*flight{},
	}
	for _, d := range []string{"specs", "templates", "cache"} {
		if err := os.MkdirAll(filepath.Join(cfg.DataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("templates: %w", err)
		}
	}
	if err := loadJSONDir(filepath.Join(cfg.DataDir, "specs"), func(name string, data []byte) error {
		var s api.TemplateSpec
		if err := json.Unmarshal(data, &s); err != nil || s.Name != name {
			return fmt.Errorf("spec %s: corrupt (%v)", name, err)
		}
		m.specs[name] = s
		return nil
	}); err != nil {
		return nil, err
	}
	if err := loadJSONDir(filepath.Join(cfg.DataDir, "templates"), func(name string, data []byte) error {
		var r record
		if err := json.Unmarshal(data, &r); err != nil || r.Name != name {
			return fmt.Errorf("template %s: corrupt (%v)", name, err)
		}
		m.records[name] = r
		return nil
	}); err != nil {
		return nil, err
	}
	return m, nil
}

func loadJSONDir(dir string, f func(name string, data []byte) error) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return fmt.Errorf("templates: %w", err)
		}
		if err := f(name, data); err != nil {
			return fmt.Errorf("templates: loading %s: %w", dir, err)
		}
	}
	return nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return renameio.WriteFile(path, data, 0o600)
}

// nameRE is the shape of a stored template name: a tenant's templates are
// stored as "<tenant>~<name>" (internal/tenant.Qualify), the admin's as
// "<name>". Clients only ever send the unqualified part.
var nameRE = lazyregexp.New(`^([a-z0-9][a-z0-9-]{0,31}~)?[a-z0-9][a-z0-9._-]{0,62}$`)

// Validate checks a spec's syntax (not whether its base exists).
func Validate(spec api.TemplateSpec) error {
	if !nameRE.MatchString(spec.Name) {
		return fmt.Errorf("template name %q: want [a-z0-9][a-z0-9._-]{0,62}: %w", spec.Name, errdefs.ErrInvalidArgument)
	}
	b, err := parseBase(spec.Base)
	if err != nil {
		return fmt.Errorf("template %s: %w", spec.Name, err)
	}
	if b.kind == baseTemplate && b.template == spec.Name {
		return fmt.Errorf("template %s: based on itself: %w", spec.Name, errdefs.ErrInvalidArgument)
	}
	if err := validate.Environ(spec.Env); err != nil {
		return fmt.Errorf("template %s: %w", spec.Name, err)
	}
	if spec.Runtime != "" && !runtime.ValidName(spec.Runtime) {
		return fmt.Errorf("template %s: runtime %q is not a backend name: %w", spec.Name, spec.Runtime, errdefs.ErrInvalidArgument)
	}
	for i, st := range spec.Steps {
		n := 0
		if st.Run != "" {
			n++
		}
		if st.Copy != nil {
			n++
			if !filepath.IsAbs(st.Copy.Src) || !strings.HasPrefix(st.Copy.Dst, "/") {
				return fmt.Errorf("template %s step %d: copy src and dst must be absolute: %w", spec.Name, i+1, errdefs.ErrInvalidArgument)
			}
		}
		if st.Env != nil {
			n++
			if err := validate.Environ(st.Env); err != nil {
				return fmt.Errorf("template %s step %d: %w", spec.Name, i+1, err)
			}
		}
		if n != 1 {
			return fmt.Errorf("template %s step %d: exactly one of run, copy, env must be set: %w", spec.Name, i+1, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Register stores a user spec (replacing an earlier one of the same name).
// Builtin names cannot be redefined (errdefs.ErrAlreadyExists) and a spec
// whose base chain leads back to itself is refused.
func (m *Manager) Register(ctx context.Context, spec api.TemplateSpec) error {
	if err := Validate(spec); err != nil {
		return err
	}
	if b, ok := builtin(spec.Name); ok {
		if specEqual(b, spec) {
			return nil
		}
		return fmt.Errorf("template %s is builtin: %w", spec.Name, errdefs.ErrAlreadyExists)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	specs := maps.Clone(m.specs)
	specs[spec.Name] = spec
	if err := checkChain(specs, spec.Name); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(m.cfg.DataDir, "specs", spec.Name+".json"), spec); err != nil {
		return fmt.Errorf("registering template %s: %w", spec.Name, err)
	}
	m.specs[spec.Name] = spec
	return nil
}

func specEqual(a, b api.TemplateSpec) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// lookupSpec returns the spec named name: builtin or registered.
func lookupSpec(specs map[string]api.TemplateSpec, name string) (api.TemplateSpec, bool) {
	if s, ok := builtin(name); ok {
		return s, true
	}
	s, ok := specs[name]
	return s, ok
}

// checkChain follows template bases from name and fails on a cycle or an
// unknown template.
func checkChain(specs map[string]api.TemplateSpec, name string) error {
	seen := map[string]bool{}
	for cur := name; ; {
		if seen[cur] {
			return fmt.Errorf("template %s: base chain loops through %s: %w", name, cur, errdefs.ErrInvalidArgument)
		}
		seen[cur] = true
		s, ok := lookupSpec(specs, cur)
		if !ok {
			return fmt.Errorf("template %s: base template %q: %w", name, cur, errdefs.ErrNotFound)
		}
		b, _ := parseBase(s.Base)
		if b.kind != baseTemplate {
			return nil
		}
		cur = b.template
	}
}

// Get returns the built template name, or the saved template version
// name refers to (NAME, NAME@N, NAME@<id prefix>; see saved.go). It fails
// with errdefs.ErrNotFound when the template has not been built (or its
// layers are gone).
func (m *Manager) Get(ctx context.Context, name string) (Template, error) {
	if t, ok, err := m.getSaved(name); ok {
		return t, err
	}
	m.mu.Lock()
	r, ok := m.records[name]
	m.mu.Unlock()
	if !ok {
		return Template{}, fmt.Errorf("template %q is not built: %w", name, errdefs.ErrNotFound)
	}
	return m.resolve(r)
}

func (m *Manager) resolve(r record) (Template, error) {
	chain, err := m.cfg.Layers.Chain(r.Layer)
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", r.Name, err)
	}
	t := Template{Name: r.Name, ID: r.Layer, Env: maps.Clone(r.Env), Spec: r.Spec, CreatedAt: r.CreatedAt}
	_, t.Builtin = builtin(r.Name)
	for _, l := range chain {
		t.Layers = append(t.Layers, l.Path)
		t.SizeBytes += l.Size
	}
	return t, nil
}

// List returns every known template sorted by name: builtins (also when not
// built), registered specs and built templates.
func (m *Manager) List(ctx context.Context) ([]api.Template, error) {
	m.mu.Lock()
	names := map[string]bool{}
	for _, s := range Builtin() {
		names[s.Name] = true
	}
	for n := range m.specs {
		names[n] = true
	}
	records := maps.Clone(m.records)
	for n := range records {
		names[n] = true
	}
	specs := maps.Clone(m.specs)
	m.mu.Unlock()

	var out []api.Template
	for _, n := range slices.Sorted(maps.Keys(names)) {
		if r, ok := records[n]; ok {
			if t, err := m.resolve(r); err == nil {
				out = append(out, t.API())
				continue
			}
		}
		_, isBuiltin := builtin(n)
		s, _ := lookupSpec(specs, n)
		out = append(out, api.Template{Name: n, Builtin: isBuiltin, Env: maps.Clone(s.Env)})
	}
	out = append(out, m.listSaved()...)
	slices.SortStableFunc(out, func(a, b api.Template) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// saveRecord persists a built template and moves its layer reference. A
// new layer is admitted first (Config.Admit); a refused one is released
// and the template stays as it was.
func (m *Manager) saveRecord(ctx context.Context, r record) error {
	owner := builtRef(r.Name)
	if err := m.cfg.Layers.Ref(ctx, r.Layer, owner); err != nil {
		return err
	}
	m.mu.Lock()
	prev, held := m.records[r.Name]
	m.mu.Unlock()
	if !held || prev.Layer != r.Layer {
		release, err := m.admit(ctx, r.Name, r.Layer)
		if err != nil {
			if uerr := m.cfg.Layers.Unref(context.WithoutCancel(ctx), r.Layer, owner); uerr != nil {
				m.log.Warn("dropping reference on refused template layer", "template", r.Name, "layer", r.Layer, "err", uerr)
			}
			return fmt.Errorf("template %s: %w", r.Name, err)
		}
		defer release()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, had := m.records[r.Name]
	if err := writeJSON(filepath.Join(m.cfg.DataDir, "templates", r.Name+".json"), r); err != nil {
		return fmt.Errorf("saving template %s: %w", r.Name, err)
	}
	m.records[r.Name] = r
	if had && old.Layer != r.Layer {
		if err := m.cfg.Layers.Unref(ctx, old.Layer, owner); err != nil {
			m.log.Warn("dropping reference on old template layer", "template", r.Name, "layer", old.Layer, "err", err)
		}
	}
	return nil
}

// cacheEntry is the persisted result of one build step.
type cacheEntry struct {
	Layer string `json:"layer"`
}

func (m *Manager) cachePath(key string) string {
	return filepath.Join(m.cfg.DataDir, "cache", key+".json")
}

// cached returns the entry for key if it exists and its layer is present.
func (m *Manager) cached(key string) (cacheEntry, bool) {
	data, err := os.ReadFile(m.cachePath(key))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("reading build cache", "key", key, "err", err)
		}
		return cacheEntry{}, false
	}
	var e cacheEntry
	if err := json.Unmarshal(data, &e); err != nil {
		return cacheEntry{}, false
	}
	if _, err := m.cfg.Layers.Get(e.Layer); err != nil {
		return cacheEntry{}, false
	}
	return e, true
}

func (m *Manager) storeCache(key string, e cacheEntry) {
	if err := writeJSON(m.cachePath(key), e); err != nil {
		m.log.Warn("writing build cache", "key", key, "err", err)
	}
}
