package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/api"
)

func init() { extraCommands = append(extraCommands, secretCmd, eventsCmd) }

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
		Use:   "set NAME [--from-file FILE|-]",
		Short: "Store a secret; the value is read from a file, stdin (-) or typed without echo",
		Long: `Store a secret in the daemon's encrypted store. The value is never shown
again: use it with "agentbox exec --secret NAME[=ENV]" or through a bridge
connector. One trailing newline of the input is dropped.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
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
			if g.json {
				return printJSON(cmd.OutOrStdout(), info)
			}
			fmt.Fprintln(cmd.OutOrStdout(), info.Name)
			return nil
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from FILE, or from stdin with -")
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secret names",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.SecretList{Secrets: list})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCREATED\tUPDATED")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, s.CreatedAt.Local().Format(time.DateTime), s.UpdatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete secrets",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range args {
				if err := c.DeleteSecret(cmd.Context(), name); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.AddCommand(set, ls, rm)
	return cmd
}

// readSecretValue reads the value from --from-file (- is stdin), or from a
// terminal without echo.
func readSecretValue(cmd *cobra.Command, from string) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	switch {
	case from == "-":
		b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxSecretInput+1))
	case from != "":
		var f *os.File
		if f, err = os.Open(from); err == nil {
			b, err = io.ReadAll(io.LimitReader(f, maxSecretInput+1))
			f.Close()
		}
	default:
		fd := int(os.Stdin.Fd())
		if !term.IsTerminal(fd) {
			return nil, errors.New("no value: use --from-file FILE, --from-file - for stdin, or run on a terminal")
		}
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

func eventsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "events SANDBOX",
		Short: "Show the events programs inside a sandbox sent through the API bridge",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			evs, err := c.Sandbox(args[0]).Events(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.SandboxEventList{Events: evs})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "TIME\tRUN\tTYPE\tNAME\tVALUE\tMESSAGE")
			for _, e := range evs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%q\n", e.Time.Local().Format(time.TimeOnly), e.RunID, e.Type, e.Name, e.Value, e.Message)
			}
			return tw.Flush()
		},
	}
}
