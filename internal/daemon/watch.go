package daemon

import (
	"context"

	"github.com/agentbox/agentbox/internal/httpapi"
)

var _ httpapi.WatchService = service{}

// WatchDir implements httpapi.WatchService (sandboxfiles.Files.Watch).
func (s service) WatchDir(ctx context.Context, id, path string, recursive bool) (httpapi.FSEvents, error) {
	w, err := s.Files.Watch(ctx, id, path, recursive)
	if err != nil {
		return nil, err
	}
	return w, nil
}
