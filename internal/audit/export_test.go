package audit

// TrackerStats reports whether r has a change tracker, how many runs it
// followed and how many of them it had to walk (events lost).
func TrackerStats(r *Recorder) (on bool, tracked, walked uint64) {
	if r.trk == nil {
		return false, 0, 0
	}
	r.trk.mu.Lock()
	defer r.trk.mu.Unlock()
	return true, r.trk.tracked + r.trk.walked, r.trk.walked
}
