package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
)

// Saved templates (frozen environments).
//
// A saved template is a name with a list of immutable versions, each a
// layer chain frozen from a sandbox (Save). "NAME" resolves to the newest
// version, "NAME@N" to version N and "NAME@<id prefix>" (at least 12 hex
// digits) to the version with that content id. Every version holds a
// reference on its top layer ("template/NAME@N") and records the tree hash
// of its merged view, which every sandbox created from it has at start.
// Saving never changes an existing version: sandboxes of older versions,
// and new ones created as NAME@N, keep their bytes.
//
// Saved templates live in DataDir/saved/NAME.json (written atomically).
// Names are those of templates; a builtin name or that of a registered or
// built template cannot be saved to.

type savedVersion struct {
	Version   int               `json:"version"`
	Layer     string            `json:"layer"`
	TreeHash  string            `json:"tree_hash"`
	Source    string            `json:"source,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

type savedRecord struct {
	Name     string         `json:"name"`
	Versions []savedVersion `json:"versions"` // oldest first
}

// savedState is the Manager's registry of saved templates.
type savedState struct {
	mu sync.Mutex // guards the files under DataDir/saved
}

func (m *Manager) savedDir() string { return filepath.Join(m.cfg.DataDir, "saved") }

func (m *Manager) readSaved(name string) (savedRecord, error) {
	data, err := os.ReadFile(filepath.Join(m.savedDir(), name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return savedRecord{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return savedRecord{}, fmt.Errorf("reading saved template %s: %w", name, err)
	}
	var r savedRecord
	if err := json.Unmarshal(data, &r); err != nil || r.Name != name {
		return savedRecord{}, fmt.Errorf("saved template %s: corrupt (%v): %w", name, err, errdefs.ErrInternal)
	}
	return r, nil
}

// Save freezes the layer chain topped by layer as a new version of the
// saved template name, with env as its default environment; source names
// what it was saved from. It returns the new version.
func (m *Manager) Save(ctx context.Context, name, layer string, env map[string]string, source string) (api.TemplateVersion, error) {
	if !nameRE.MatchString(name) {
		return api.TemplateVersion{}, fmt.Errorf("template name %q: want [a-z0-9][a-z0-9._-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	if _, ok := builtin(name); ok {
		return api.TemplateVersion{}, fmt.Errorf("template %s is builtin: %w", name, errdefs.ErrAlreadyExists)
	}
	m.mu.Lock()
	_, spec := m.specs[name]
	_, built := m.records[name]
	m.mu.Unlock()
	if spec || built {
		return api.TemplateVersion{}, fmt.Errorf("template %s is a built template, not a saved one: %w", name, errdefs.ErrAlreadyExists)
	}
	chain, err := m.cfg.Layers.Paths(layer)
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}
	view, err := layers.MergedView(ctx, chain, m.cfg.IDs)
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}
	hash, err := view.Hash(ctx)
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}

	// The admission's release runs once saved.mu is released (deferred
	// first, so it runs last).
	release := func() {}
	defer func() { release() }()
	m.saved.mu.Lock()
	defer m.saved.mu.Unlock()
	if err := os.MkdirAll(m.savedDir(), 0o700); err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}
	rec, err := m.readSaved(name)
	if errdefs.IsNotFound(err) {
		rec, err = savedRecord{Name: name}, nil
	}
	if err != nil {
		return api.TemplateVersion{}, err
	}
	v := savedVersion{Version: 1, Layer: layer, TreeHash: hash, Source: source, Env: maps.Clone(env), CreatedAt: time.Now().UTC()}
	if n := len(rec.Versions); n > 0 {
		v.Version = rec.Versions[n-1].Version + 1
	}
	owner := versionRef(name, v.Version)
	// The reference first: a crash before the record is written leaves an
	// unlisted layer, never a listed version without its layer.
	if err := m.cfg.Layers.Ref(ctx, layer, owner); err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}
	if release, err = m.admit(ctx, name, layer); err != nil {
		release = func() {}
		_ = m.cfg.Layers.Unref(context.WithoutCancel(ctx), layer, owner)
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}
	rec.Versions = append(rec.Versions, v)
	if err := writeJSON(filepath.Join(m.savedDir(), name+".json"), rec); err != nil {
		_ = m.cfg.Layers.Unref(context.WithoutCancel(ctx), layer, owner)
		return api.TemplateVersion{}, fmt.Errorf("saving template %s: %w", name, err)
	}
	m.log.InfoContext(ctx, "template version saved", "template", name, "version", v.Version, "layer", layer, "tree_hash", hash)
	return m.versionAPI(name, v), nil
}

func (m *Manager) versionAPI(name string, v savedVersion) api.TemplateVersion {
	tv := api.TemplateVersion{Name: name, Version: v.Version, ID: v.Layer, TreeHash: v.TreeHash, Source: v.Source, Env: maps.Clone(v.Env), CreatedAt: v.CreatedAt}
	if chain, err := m.cfg.Layers.Chain(v.Layer); err == nil {
		for _, l := range chain {
			tv.SizeBytes += l.Size
		}
	}
	return tv
}

// Versions lists the versions of saved template name, oldest first.
func (m *Manager) Versions(ctx context.Context, name string) ([]api.TemplateVersion, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	m.saved.mu.Lock()
	rec, err := m.readSaved(name)
	m.saved.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]api.TemplateVersion, 0, len(rec.Versions))
	for _, v := range rec.Versions {
		out = append(out, m.versionAPI(name, v))
	}
	return out, nil
}

// getSaved resolves ref (NAME, NAME@N or NAME@<id prefix>) among saved
// templates. ok is false when ref names no saved template.
func (m *Manager) getSaved(ref string) (t Template, ok bool, err error) {
	name, sel, versioned := strings.Cut(ref, "@")
	if !nameRE.MatchString(name) {
		return Template{}, false, nil
	}
	m.saved.mu.Lock()
	rec, err := m.readSaved(name)
	m.saved.mu.Unlock()
	if errdefs.IsNotFound(err) || (err == nil && len(rec.Versions) == 0) {
		return Template{}, false, nil
	}
	if err != nil {
		return Template{}, true, err
	}
	v := rec.Versions[len(rec.Versions)-1]
	if versioned {
		i := slices.IndexFunc(rec.Versions, func(v savedVersion) bool {
			if n, err := strconv.Atoi(sel); err == nil {
				return v.Version == n
			}
			return len(sel) >= 12 && strings.HasPrefix(v.Layer, sel)
		})
		if i < 0 {
			return Template{}, true, fmt.Errorf("template %s has no version %q: %w", name, sel, errdefs.ErrNotFound)
		}
		v = rec.Versions[i]
	}
	chain, err := m.cfg.Layers.Chain(v.Layer)
	if err != nil {
		return Template{}, true, fmt.Errorf("template %s@%d: %w", name, v.Version, err)
	}
	t = Template{
		Name:      ref,
		ID:        v.Layer,
		Env:       maps.Clone(v.Env),
		Spec:      api.TemplateSpec{Name: name, Base: "saved"},
		CreatedAt: v.CreatedAt,
	}
	for _, l := range chain {
		t.Layers = append(t.Layers, l.Path)
		t.SizeBytes += l.Size
	}
	return t, true, nil
}

// listSaved returns the newest version of every saved template.
func (m *Manager) listSaved() []api.Template {
	m.saved.mu.Lock()
	ents, _ := os.ReadDir(m.savedDir())
	m.saved.mu.Unlock()
	var out []api.Template
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		if t, ok, err := m.getSaved(name); ok && err == nil {
			out = append(out, t.API())
		}
	}
	return out
}
