package layers

// ChainsSize returns the bytes on disk (Layer.Size, measured once when the
// layer was committed and kept in its metadata) of every layer in the
// chains of roots, each layer counted once however many chains share it,
// leaving out every layer in the chains of exclude. Unknown IDs are
// ignored. It reads metadata only, and unlike Get it does not count as a
// use of the layers (GCOptions.MinAge).
func (s *Store) ChainsSize(roots, exclude []string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	walk := func(id string, visit func(*Layer)) {
		for id != "" && !seen[id] {
			l, ok := s.layers[id]
			if !ok {
				return
			}
			seen[id] = true
			visit(l)
			id = l.Parent
		}
	}
	for _, id := range exclude {
		walk(id, func(*Layer) {})
	}
	var n int64
	for _, id := range roots {
		walk(id, func(l *Layer) { n += l.Size })
	}
	return n
}
