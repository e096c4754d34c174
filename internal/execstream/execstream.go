// Package execstream holds the one event-stream type of exec and attach,
// Stream, shared by its producer (internal/sandbox, over the guest client),
// the wrappers that add behaviour on the way out (internal/sandbox,
// internal/pipeline) and its consumer (the HTTP edge, internal/httpapi).
// It depends on nothing but the api package, so every layer of the exec
// path may import it without importing another.
//
// # The exec-streaming path
//
// A foreground exec (POST /v1/sandboxes/{id}/exec) travels, request first:
//
//  1. internal/httpapi/stream.go handler.exec validates the request and
//     calls Service.Exec.
//  2. internal/daemon/pipeline.go service.Exec hands it to the execution
//     pipeline as an API-triggered run.
//  3. internal/pipeline/pipeline.go Pipeline.Execute journals the run and
//     calls Sandboxes.Exec (the sandbox Manager).
//  4. internal/sandbox/exec.go Manager.Exec (internal/sandbox/txn.go
//     execTransaction first, for checkpoint_before or rollback_on_failure,
//     which calls Manager.Exec in turn) acquires the sandbox, runs the
//     request through the extensions' exec wrappers (internal/sandbox/
//     hookcall.go: runsecrets puts secrets and the run token into the
//     environment, sandboxnet the proxy variables), merges the sandbox's
//     environment under it and calls the guest client.
//  5. internal/guest/client/exec.go Client.Exec sends the request over the
//     guest connection (internal/guest/proto frames); inside the sandbox
//     internal/guest/exec.go starts the process and streams its output.
//
// The events come back through these Streams, innermost first; each
// wrapper returns the events of the one inside it, changed as said:
//
//  1. *client.Stream (internal/guest/client/exec.go): decodes the guest's
//     frames; the source.
//  2. runStream (internal/runsecrets/stream.go, returned by its
//     ExecRun.Started through the core's exec wrapper chain): redacts
//     secret values from output and ends the run (revoking its token) when
//     the exit passes. Only when there is something to redact or a run.
//  3. oomStream (internal/sandbox/limits.go, Manager.watchOOM): samples the
//     OOM counter when the process exits killed by SIGKILL.
//  4. busyStream (internal/sandbox/lifecycle.go, Manager.holdStream):
//     counts the open stream as activity (the idle timer waits) until it
//     is closed.
//  5. txnStream (internal/sandbox/txn.go): transactions only; restores the
//     checkpoint before delivering a failed exit, and follows the command
//     to its end when the client leaves.
//  6. recStream (internal/pipeline/recstream.go): notes the pid and output
//     in the run record and finishes it when the exit passes.
//  7. handler.pumpExec (internal/httpapi/stream.go): writes each event as
//     one NDJSON line and flushes it; closes the stream when the client
//     goes away or the daemon shuts down.
//
// Attach (GET .../processes/{pid}/attach) takes the same path without the
// pipeline and the transaction: internal/daemon/daemon.go service.Attach,
// Manager.Attach, Client.Attach, then wrappers 2 (redaction only, through
// the core's stream wrappers: runsecrets' WrapStream), 3 and 4,
// and pumpExec. Manager.WatchProcess, with which the pipeline follows a
// detached run to its exit, wraps the guest's stream with 2 only.
package execstream

import "github.com/agentbox/agentbox/api"

// Stream yields the events of one exec or attach: "started" first (exec
// only), then "stdout"/"stderr" output, then exactly one "exit" or "error".
//
// Next blocks until the next event and returns io.EOF after the final exit
// or error event; any other error means the stream broke (the guest went
// away, the context ended, the stream was closed). Next is not safe for
// concurrent use with itself.
//
// Close ends the attachment, never the process: the process keeps running
// (its own timeout still applies) and can be attached to again. Close is
// idempotent and safe to call concurrently with a blocked Next, which then
// returns promptly with an error. Whoever receives a Stream closes it.
type Stream interface {
	Next() (api.ExecEvent, error)
	Close() error
}

// Final reports whether ev is the last event of a stream: an exit or an
// error.
func Final(ev api.ExecEvent) bool {
	return ev.Type == api.EventExit || ev.Type == api.EventError
}
