package audit

// TrackerStats reports whether r has a change tracker, how many runs it
// followed and how many of them it had to walk (events lost).
func TrackerStats(r *Recorder) (on bool, tracked, walked uint64) {
	if r.trk == nil {
		return false, 0, 0
	}
	t, w := r.trk.stats()
	return true, t + w, w
}
