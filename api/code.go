package api

import (
	"encoding/json"
	"strings"
)

// Code interpreter (docs/CODE-INTERPRETER.md): POST /v1/sandboxes/{id}/code
// runs a cell of code in a stateful context inside the sandbox and streams
// CodeEvents (application/x-ndjson). The events are those of E2B's
// code-interpreter protocol, which the in-sandbox server speaks on port
// 49999, plus CodeEventStreamError for what failed outside the code.

// Code languages.
const (
	LanguagePython     = "python"
	LanguageBash       = "bash"
	LanguageJavaScript = "javascript"
)

// CodeLanguage normalises a language name: "" and "py" are Python, "js"
// and "node" JavaScript, "sh" bash; ok is false for one not supported.
func CodeLanguage(s string) (lang string, ok bool) {
	switch strings.ToLower(s) {
	case "", "python", "python3", "py":
		return LanguagePython, true
	case "javascript", "js", "node", "nodejs":
		return LanguageJavaScript, true
	case "bash", "sh", "shell":
		return LanguageBash, true
	}
	return "", false
}

// CodeRequest runs a cell. Context and Language are exclusive: a context
// has its language; with neither, the default Python context runs it.
type CodeRequest struct {
	Code     string            `json:"code"`
	Language string            `json:"language,omitempty"` // python (default), bash, javascript (alias js)
	Context  string            `json:"context,omitempty"`  // a context id from POST .../code/contexts
	Env      map[string]string `json:"env,omitempty"`      // for this cell only (bash: exported in the context)
	// TimeoutSeconds interrupts the cell after this long (SIGINT; Python
	// raises KeyboardInterrupt, reported as a TimeoutError); a cell that
	// does not stop within 5 s more has its context restarted. 0: 300 s.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
}

// Code event types, one JSON object per line of a code stream. A stream
// ends with end_of_execution, or stream_error when the cell could not run
// to its end for a reason outside the code (no interpreter, the server
// failed, the sandbox went away).
const (
	CodeEventStdout             = "stdout"               // Text
	CodeEventStderr             = "stderr"               // Text
	CodeEventResult             = "result"               // Text and rich forms; IsMainResult for the last expression's value
	CodeEventError              = "error"                // Name, Value, Traceback: the code raised
	CodeEventNumberOfExecutions = "number_of_executions" // ExecutionCount
	CodeEventEndOfExecution     = "end_of_execution"     // last event
	CodeEventStreamError        = "stream_error"         // Error; last event
)

// CodeEvent is one line of a code stream. Rich forms are as Jupyter's MIME
// bundle: PNG and JPEG base64, the others text; JSON any JSON value.
type CodeEvent struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`

	HTML         string          `json:"html,omitempty"`
	Markdown     string          `json:"markdown,omitempty"`
	SVG          string          `json:"svg,omitempty"`
	PNG          string          `json:"png,omitempty"`
	JPEG         string          `json:"jpeg,omitempty"`
	PDF          string          `json:"pdf,omitempty"`
	LaTeX        string          `json:"latex,omitempty"`
	JSON         json.RawMessage `json:"json,omitempty"`
	JavaScript   string          `json:"javascript,omitempty"`
	IsMainResult bool            `json:"is_main_result,omitempty"`

	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`

	ExecutionCount int `json:"execution_count,omitempty"`

	Error *Error `json:"error,omitempty"`
}

// Final reports whether e is the last event of a code stream.
func (e CodeEvent) Final() bool {
	return e.Type == CodeEventEndOfExecution || e.Type == CodeEventStreamError
}

// CodeContext is a stateful execution context: one interpreter process
// whose variables, imports and working directory persist between cells.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CreateCodeContextRequest creates a context.
type CreateCodeContextRequest struct {
	Language string `json:"language,omitempty"` // default python
	Cwd      string `json:"cwd,omitempty"`      // default the server's (the first code call's cwd, /root)
}

// CodeContextList is GET .../code/contexts.
type CodeContextList struct {
	Contexts []CodeContext `json:"contexts"`
}
