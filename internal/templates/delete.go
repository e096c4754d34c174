package templates

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Names returns the stored name of every template that is not builtin:
// registered specs, built or imported templates and saved ones, sorted.
func (m *Manager) Names() []string {
	m.mu.Lock()
	names := map[string]bool{}
	for n := range m.specs {
		names[n] = true
	}
	for n := range m.records {
		names[n] = true
	}
	m.mu.Unlock()
	m.saved.mu.Lock()
	ents, _ := os.ReadDir(m.savedDir())
	m.saved.mu.Unlock()
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(n, ".") {
			names[n] = true
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// Delete forgets template name (its stored name): its registered spec,
// its built record and every saved version, and drops the layer
// references they held (sandboxes running on those layers keep theirs;
// the layer store's collection removes what nothing references). Builtin
// templates are not deleted. Deleting an unknown name is no error, so a
// Delete that failed part-way can be repeated.
func (m *Manager) Delete(ctx context.Context, name string) error {
	if _, ok := builtin(name); ok || !nameRE.MatchString(name) {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	m.mu.Lock()
	if _, ok := m.specs[name]; ok {
		if err := removeFile(filepath.Join(m.cfg.DataDir, "specs", name+".json")); err != nil {
			errs = append(errs, err)
		} else {
			delete(m.specs, name)
		}
	}
	r, built := m.records[name]
	if built {
		if err := removeFile(filepath.Join(m.cfg.DataDir, "templates", name+".json")); err != nil {
			errs = append(errs, err)
			built = false
		} else {
			delete(m.records, name)
		}
	}
	m.mu.Unlock()
	if built {
		if err := m.cfg.Layers.Unref(ctx, r.Layer, builtRef(name)); err != nil {
			m.log.Warn("dropping a deleted template's layer reference", "template", name, "layer", r.Layer, "err", err)
		}
	}
	m.saved.mu.Lock()
	rec, err := m.readSaved(name)
	if err != nil && !errdefs.IsNotFound(err) {
		// Unreadable: its layers cannot be released, but its name must
		// not outlive the delete.
		m.log.Warn("deleting an unreadable saved template", "template", name, "err", err)
		if err := removeFile(filepath.Join(m.savedDir(), name+".json")); err != nil {
			errs = append(errs, err)
		}
	}
	if err == nil {
		// The record goes first: a crash after it leaves unreferenced
		// (collectable) layers, never a listed version without its layer.
		if err := removeFile(filepath.Join(m.savedDir(), name+".json")); err != nil {
			errs = append(errs, err)
			rec.Versions = nil
		}
	}
	m.saved.mu.Unlock()
	for _, v := range rec.Versions {
		if err := m.cfg.Layers.Unref(ctx, v.Layer, versionRef(name, v.Version)); err != nil {
			m.log.Warn("dropping a deleted template version's layer reference", "template", name, "version", v.Version, "layer", v.Layer, "err", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	m.log.InfoContext(ctx, "template deleted", "template", name)
	return nil
}

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
