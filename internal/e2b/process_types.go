package e2b

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Messages of process.Process (envd's process.proto), in their protobuf
// JSON form.

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

type ptyConfig struct {
	Size *ptySize `json:"size,omitempty"`
}

type startRequest struct {
	Process *processConfig `json:"process"`
	Pty     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	// Stdin keeps stdin open; unset means true (older SDKs).
	Stdin *bool `json:"stdin,omitempty"`
}

type processSelector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type startEvent struct {
	Pid uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

type empty struct{}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *empty      `json:"keepalive,omitempty"`
}

// processEventResponse is StartResponse and ConnectResponse.
type processEventResponse struct {
	Event *processEvent `json:"event"`
}

type connectRequest struct {
	Process *processSelector `json:"process"`
}

type processInfo struct {
	Config *processConfig `json:"config"`
	Pid    uint32         `json:"pid"`
	Tag    *string        `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	Pty   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *processInput    `json:"input"`
}

type streamInputRequest struct {
	Start *struct {
		Process *processSelector `json:"process"`
	} `json:"start,omitempty"`
	Data *struct {
		Input *processInput `json:"input"`
	} `json:"data,omitempty"`
	Keepalive *empty `json:"keepalive,omitempty"`
}

type closeStdinRequest struct {
	Process *processSelector `json:"process"`
}

type updateRequest struct {
	Process *processSelector `json:"process"`
	Pty     *ptyConfig       `json:"pty,omitempty"`
}

// signal is process.Signal: by name or by number in JSON.
type signal int32

const (
	signalUnspecified signal = 0
	signalKill        signal = 9
	signalTerm        signal = 15
)

func (s *signal) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		switch strings.ToUpper(name) {
		case "SIGNAL_SIGKILL":
			*s = signalKill
		case "SIGNAL_SIGTERM":
			*s = signalTerm
		case "SIGNAL_UNSPECIFIED":
			*s = signalUnspecified
		default:
			return fmt.Errorf("signal %q: %w", name, errdefs.ErrInvalidArgument)
		}
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 32)
	if err != nil {
		return fmt.Errorf("signal %s: %w", b, errdefs.ErrInvalidArgument)
	}
	*s = signal(n)
	return nil
}

type sendSignalRequest struct {
	Process *processSelector `json:"process"`
	Signal  signal           `json:"signal"`
}
