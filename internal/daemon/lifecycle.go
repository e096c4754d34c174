package daemon

import "github.com/agentbox/agentbox/internal/httpapi"

// The Manager's lifecycle methods (pause, resume, hibernate, transitions,
// create-or-get by name) reach the HTTP edge through the service adapter.
var _ httpapi.LifecycleService = service{}
