package daemon

import "github.com/agentbox/agentbox/internal/httpapi"

// The Manager's quarantine of corrupt store records reaches the HTTP edge
// through the service adapter.
var _ httpapi.QuarantineService = service{}
