package sandbox

import "context"

// What the core offers the layer garbage collector (internal/layergc):
// the layers its sandboxes run on, which no collection may remove.

// LayersInUse returns the host directory of the top layer of every
// sandbox the core knows, in memory and in the store (a sandbox's
// record names its whole chain, top-most first; the layers below the top
// are kept by the top's parent links). A directory may appear more than
// once. Safe for concurrent use; a sandbox created meanwhile may be
// missed, which is why the collector spares young layers.
func (m *Manager) LayersInUse(ctx context.Context) ([]string, error) {
	var tops []string
	m.mu.Lock()
	for _, b := range m.sandboxes {
		b.mu.Lock()
		if len(b.rec.Layers) > 0 {
			tops = append(tops, b.rec.Layers[0])
		}
		b.mu.Unlock()
	}
	m.mu.Unlock()
	recs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if len(r.Layers) > 0 {
			tops = append(tops, r.Layers[0])
		}
	}
	return tops, nil
}
