package guest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// account is a resolved user.
type account struct {
	name   string // empty for a uid without a passwd entry
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups
	home   string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// readColonFile returns the colon-separated records of an /etc file with
// at least n fields. A missing file has no records.
func readColonFile(path string, n int) ([][]string, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	// Start small: this runs twice per exec, and the files are tiny.
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) >= n {
			out = append(out, fields)
		}
	}
	return out, sc.Err()
}

func readPasswd(etc string) ([]passwdEntry, error) {
	recs, err := readColonFile(filepath.Join(etc, "passwd"), 7)
	if err != nil {
		return nil, err
	}
	var out []passwdEntry
	for _, r := range recs {
		uid, err1 := strconv.ParseUint(r[2], 10, 32)
		gid, err2 := strconv.ParseUint(r[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, passwdEntry{name: r[0], uid: uint32(uid), gid: uint32(gid), home: r[5]})
	}
	return out, nil
}

func readGroup(etc string) ([]groupEntry, error) {
	recs, err := readColonFile(filepath.Join(etc, "group"), 4)
	if err != nil {
		return nil, err
	}
	var out []groupEntry
	for _, r := range recs {
		gid, err := strconv.ParseUint(r[2], 10, 32)
		if err != nil {
			continue
		}
		g := groupEntry{name: r[0], gid: uint32(gid)}
		if r[3] != "" {
			g.members = strings.Split(r[3], ",")
		}
		out = append(out, g)
	}
	return out, nil
}

// lookupAccount resolves spec — "", "name", "uid", "name:group" or
// "uid:gid" (groups by name or number) — with the passwd and group files in
// etc. An empty spec is the guest's own uid.
func lookupAccount(etc, spec string) (account, error) {
	users, err := readPasswd(etc)
	if err != nil {
		return account{}, fmt.Errorf("reading passwd: %w", err)
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if spec == "" {
		userPart = strconv.Itoa(os.Getuid())
	}
	if userPart == "" || (hasGroup && groupPart == "") {
		return account{}, fmt.Errorf("invalid user %q: %w", spec, errdefs.ErrInvalidArgument)
	}
	acct := account{home: "/"}
	var pw *passwdEntry
	if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		acct.uid = uint32(n)
		for i := range users {
			if users[i].uid == acct.uid {
				pw = &users[i]
				break
			}
		}
	} else {
		for i := range users {
			if users[i].name == userPart {
				pw = &users[i]
				break
			}
		}
		if pw == nil {
			return account{}, fmt.Errorf("user %q not found in /etc/passwd: %w", userPart, errdefs.ErrInvalidArgument)
		}
		acct.uid = pw.uid
	}
	if pw != nil {
		acct.name, acct.gid = pw.name, pw.gid
		if pw.home != "" {
			acct.home = pw.home
		}
	}
	groups, err := readGroup(etc)
	if err != nil {
		return account{}, fmt.Errorf("reading group: %w", err)
	}
	if hasGroup {
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			acct.gid = uint32(n)
		} else {
			found := false
			for _, g := range groups {
				if g.name == groupPart {
					acct.gid, found = g.gid, true
					break
				}
			}
			if !found {
				return account{}, fmt.Errorf("group %q not found in /etc/group: %w", groupPart, errdefs.ErrInvalidArgument)
			}
		}
	}
	acct.groups = []uint32{}
	if acct.name != "" {
		for _, g := range groups {
			for _, m := range g.members {
				if m == acct.name && g.gid != acct.gid {
					acct.groups = append(acct.groups, g.gid)
					break
				}
			}
		}
	}
	return acct, nil
}
