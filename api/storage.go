package api

// GCRequest is the optional body of POST /v1/gc.
type GCRequest struct {
	// MinAgeSeconds spares layers created or used less than this long ago
	// (they may be about to be referenced). Omitted: 600.
	MinAgeSeconds *int64 `json:"min_age_seconds,omitempty"`
}

// GCResult is the body of the POST /v1/gc response.
type GCResult struct {
	RemovedLayers int   `json:"removed_layers"`
	FreedBytes    int64 `json:"freed_bytes"`
	Layers        int   `json:"layers"` // layers left
}

// ImportTemplateRequest is the JSON body of POST /v1/templates/import
// (Content-Type application/json) that imports an OCI image layout
// directory on the daemon host. Any other body is the image archive itself
// (an OCI image archive or a `docker save` archive, tar, optionally gzip'd).
type ImportTemplateRequest struct {
	Path string `json:"path"`
}
