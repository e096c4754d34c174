package e2b

import (
	"math"
	"net/http"
	"time"

	"github.com/agentbox/agentbox/api"
)

// metricSample is how long metrics measures CPU use over.
const metricSample = 200 * time.Millisecond

// metrics answers one sample measured now: agentbox keeps no history of
// a sandbox's counters.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	ctx, id := r.Context(), r.PathValue("id")
	sb, err := s.sb.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	m := sandboxMetric{CPUCount: max(1, int(math.Ceil(sb.Resources.CPUs))), MemTotal: sb.Resources.MemoryBytes, DiskTotal: sb.Resources.DiskBytes}
	if sb.State == api.StateRunning {
		a, err := s.sb.SandboxStats(ctx, id)
		if err != nil {
			return err
		}
		t := time.NewTimer(metricSample)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		b, err := s.sb.SandboxStats(ctx, id)
		if err != nil {
			return err
		}
		m.MemUsed = b.MemoryBytes
		m.CPUUsedPct = 100 * float64(b.CPUTime-a.CPUTime) / float64(metricSample) / float64(m.CPUCount)
	}
	if sb.Disk != nil {
		m.DiskUsed = sb.Disk.UsedBytes
		if m.DiskTotal == 0 {
			m.DiskTotal = sb.Disk.TotalBytes
		}
	}
	now := time.Now().UTC()
	m.Timestamp, m.TimestampUnix = now, now.Unix()
	writeJSON(w, http.StatusOK, []sandboxMetric{m})
	return nil
}
