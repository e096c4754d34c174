package procwatch

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// StartTime returns field 22 (starttime, in clock ticks since boot) of
// /proc/<pid>/stat: with the pid, what names one process for as long as
// the host runs.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStartTime(b)
}

// parseStartTime reads field 22 of a /proc/<pid>/stat line.
func parseStartTime(stat []byte) (uint64, error) {
	// comm (field 2) may contain spaces and parentheses: split after the
	// last ')'. The remaining fields start at field 3.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	fields := strings.Fields(string(stat[i+1:]))
	const idx = 22 - 3
	if len(fields) <= idx {
		return 0, errors.New("short /proc stat")
	}
	return strconv.ParseUint(fields[idx], 10, 64)
}
