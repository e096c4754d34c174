package audit

import (
	"encoding/json"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// decodeEvent decodes a record's event. Its sequence number is the
// record's, the one the hash chain covers, whatever the event says.
func decodeEvent(r record) (api.SandboxEvent, error) {
	var ev api.SandboxEvent
	if err := json.Unmarshal(r.Event, &ev); err != nil {
		return ev, fmt.Errorf("record %d: decoding event: %w: %w", r.Seq, err, errdefs.ErrInvalidArgument)
	}
	ev.Seq = r.Seq
	return ev, nil
}
