package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, secretCmd) }

// maxSecretInput bounds what secret set reads (the daemon's limit is lower).
const maxSecretInput = 1 << 20

func secretCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "secret",
		Aliases: []string{"secrets"},
		Short:   "Store, list and delete secrets (values are write-only)",
	}
	var fromFile string
	set := &cobra.Command{
		Use:   "set NAME [-] [--from-file FILE|-]",
		Short: "Store a secret; the value is read from stdin, a file, or typed without echo",
		Long: `Store a secret in the daemon's encrypted store. The value is never shown
again: use it with "agentbox exec --secret NAME[=ENV]" or through a bridge
connector. One trailing newline of the input is dropped.

The value is read from --from-file FILE, from stdin when it is not a
terminal or when "-" is given (printf %s "$TOKEN" | agentbox secret set gh),
and otherwise typed on the terminal without echo. It is never an argument:
arguments show in the process list and the shell's history.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.RangeArgs(1, 2)(cmd, args); err != nil {
				return err
			}
			if len(args) == 2 && args[1] != "-" {
				return errors.New(`the value is never an argument (it would show in the process list): pipe it to stdin, give "-", or use --from-file`)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			if len(args) == 2 {
				if fromFile != "" && fromFile != "-" {
					return errors.New(`give either "-" or --from-file, not both`)
				}
				fromFile = "-"
			}
			value, err := readSecretValue(cmd, fromFile)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.SetSecret(cmd.Context(), args[0], value)
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, info, info.Name)
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from FILE, or from stdin with -")
	ls := lsCommand("List secret names", listing[agentbox.SecretInfo]{
		fetch:  noArgs((*agentbox.Client).Secrets),
		doc:    func(list []agentbox.SecretInfo) any { return api.SecretList{Secrets: list} },
		header: "NAME\tCREATED\tUPDATED",
		row: func(s agentbox.SecretInfo) string {
			return fmt.Sprintf("%s\t%s\t%s", s.Name, s.CreatedAt.Local().Format(time.DateTime), s.UpdatedAt.Local().Format(time.DateTime))
		},
	})
	rm := removeCommand("rm NAME...", "Delete secrets", removeQuiet, (*agentbox.Client).DeleteSecret)
	cmd.AddCommand(set, ls, rm)
	return cmd
}

// readSecretValue reads the value from --from-file (- is stdin), from
// stdin when it is not a terminal, or from a terminal without echo.
func readSecretValue(cmd *cobra.Command, from string) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	in := cmd.InOrStdin()
	f, isFile := in.(*os.File)
	onTerminal := isFile && term.IsTerminal(int(f.Fd()))
	switch {
	case from == "-" || from == "" && !onTerminal:
		if from == "" && isFile {
			if st, serr := f.Stat(); serr == nil && st.Mode()&os.ModeCharDevice != 0 {
				// /dev/null and other character devices: nothing to read.
				return nil, errors.New("no value: pipe it to stdin, use --from-file FILE, or run on a terminal")
			}
		}
		b, err = io.ReadAll(io.LimitReader(in, maxSecretInput+1))
	case from != "":
		var file *os.File
		if file, err = os.Open(from); err == nil {
			b, err = io.ReadAll(io.LimitReader(file, maxSecretInput+1))
			file.Close()
		}
	default:
		fd := int(f.Fd())
		fmt.Fprint(cmd.ErrOrStderr(), "Value: ")
		b, err = term.ReadPassword(fd)
		fmt.Fprintln(cmd.ErrOrStderr())
	}
	if err != nil {
		return nil, fmt.Errorf("reading the secret value: %w", err)
	}
	if len(b) > maxSecretInput {
		return nil, fmt.Errorf("secret value larger than %d bytes", maxSecretInput)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return nil, errors.New("the secret value is empty")
	}
	return b, nil
}

// execSecrets parses --secret NAME[=ENV] flags.
func execSecrets(flags []string) ([]api.ExecSecret, error) {
	var out []api.ExecSecret
	for _, f := range flags {
		name, env, _ := strings.Cut(f, "=")
		if name == "" {
			return nil, fmt.Errorf("--secret %q: want NAME or NAME=ENVVAR", f)
		}
		out = append(out, api.ExecSecret{Name: name, Env: env})
	}
	return out, nil
}
