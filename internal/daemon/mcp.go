package daemon

import (
	"context"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/pipeline"
)

// mcpService is the service as the MCP tools see it: the same methods,
// with Exec the MCP trigger of the pipeline (run records say trigger mcp,
// who is the request's caller).
type mcpService struct{ service }

var _ mcpserver.Sandboxes = mcpService{}

// Exec implements mcpserver.Sandboxes.
func (s mcpService) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	exe, err := s.pipelineAPI.p.Execute(ctx, pipeline.Run{Trigger: api.TriggerMCP, Who: httpapi.CallerFrom(ctx), SandboxID: id, Exec: req})
	if err != nil {
		return nil, err
	}
	return exe.Stream, nil
}
