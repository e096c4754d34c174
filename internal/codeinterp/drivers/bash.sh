# agentbox code interpreter: the bash driver (docs/CODE-INTERPRETER.md).
#
# Run as `bash -c <this file>` by the Go server (internal/codeinterp), one
# process per context, with the protocol of the Python driver: a request
# on fd 3 is one line naming a file that holds the cell (the server writes
# it, with the cell's env as exports, in a private directory), events go
# to fd 4, the cell's output to fds 1 and 2, the marker to both after each
# cell, then "done". A cell is sourced: variables, functions and the
# working directory persist; an exit ends the context. A non-zero status
# of the cell is reported as an error event.
__abx_mark=$AGENTBOX_CODE_MARKER
unset AGENTBOX_CODE_MARKER
trap ':' INT
__abx_n=0
printf '{"type":"ready","pid":%d}\n' "$$" >&4
while IFS= read -r __abx_file <&3; do
	__abx_n=$((__abx_n + 1))
	source "$__abx_file" 3<&- 4>&-
	__abx_rc=$?
	rm -f -- "$__abx_file"
	if [ "$__abx_rc" -ne 0 ]; then
		printf '{"type":"error","name":"ExitStatus","value":"exit status %d","traceback":""}\n' "$__abx_rc" >&4
	fi
	printf '%s' "$__abx_mark"
	printf '%s' "$__abx_mark" >&2
	printf '{"type":"done","count":%d,"marked":[true,true]}\n' "$__abx_n" >&4
done
