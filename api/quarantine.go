package api

import "time"

// QuarantinedRecord is a store record the daemon set aside as corrupt at
// start-up (GET /v1/admin/quarantine). It is kept verbatim for inspection;
// the sandbox or checkpoint it described was cleaned up.
type QuarantinedRecord struct {
	// Bucket is where the record was: "sandboxes" or "checkpoints".
	Bucket string `json:"bucket"`
	// Key is its key there (the sandbox or checkpoint id).
	Key string `json:"key"`
	// Reason says why it could not be used.
	Reason string `json:"reason"`
	// Raw is the record's stored bytes (base64 in JSON).
	Raw []byte `json:"raw"`
	// At is when it was quarantined.
	At time.Time `json:"at"`
}
