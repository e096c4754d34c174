package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, codeCmd) }

// codeCmd runs a cell in a sandbox's code interpreter.
func codeCmd() *cobra.Command {
	var (
		lang, context, pngDir string
		env                   []string
		timeout               time.Duration
	)
	cmd := &cobra.Command{
		Use:   "code [flags] ID|NAME [CODE|-]",
		Short: "Run code in a sandbox's stateful code interpreter (Python, JavaScript, bash)",
		Long: "Run a cell of code in the sandbox's code interpreter (docs/CODE-INTERPRETER.md): variables\n" +
			"persist between calls in the same context (the language's default one, or --context).\n" +
			"CODE is read from stdin when it is - or missing. Output is printed as it comes, then the\n" +
			"value of the last expression; figures are saved as PNG files with --png-dir. Exits 1 when\n" +
			"the code raised (its traceback on stderr). With --json, prints the events as NDJSON.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			code := "-"
			if len(args) == 2 {
				code = args[1]
			}
			if code == "-" {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				code = string(b)
			}
			envMap := map[string]string{}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--env %q: want KEY=VALUE", kv)
				}
				envMap[k] = v
			}
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			enc := json.NewEncoder(out)
			pngs := 0
			var onErr error
			opts := agentbox.CodeOptions{Language: lang, Context: context, Env: envMap, Timeout: timeout.Seconds(), OnEvent: func(ev api.CodeEvent) {
				if g.json {
					_ = enc.Encode(ev)
				}
				if ev.Type == api.CodeEventResult && ev.PNG != "" && pngDir != "" && onErr == nil {
					pngs++
					b, err := base64.StdEncoding.DecodeString(ev.PNG)
					if err == nil {
						p := filepath.Join(pngDir, fmt.Sprintf("result-%d.png", pngs))
						err = os.WriteFile(p, b, 0o644)
						if err == nil && !g.json {
							fmt.Fprintln(errOut, "saved", p)
						}
					}
					onErr = err
				}
				if g.json {
					return
				}
				switch ev.Type {
				case api.CodeEventStdout:
					fmt.Fprint(out, ev.Text)
				case api.CodeEventStderr:
					fmt.Fprint(errOut, ev.Text)
				case api.CodeEventResult:
					if ev.IsMainResult && ev.Text != "" {
						fmt.Fprintln(out, ev.Text)
					}
				case api.CodeEventError:
					if ev.Traceback != "" {
						fmt.Fprint(errOut, strings.TrimSuffix(ev.Traceback, "\n")+"\n")
					} else {
						fmt.Fprintf(errOut, "%s: %s\n", ev.Name, ev.Value)
					}
				}
			}}
			ex, err := c.Sandbox(args[0]).RunCode(cmd.Context(), code, opts)
			if err != nil {
				return err
			}
			if onErr != nil {
				return fmt.Errorf("saving a PNG: %w", onErr)
			}
			if ex.Error != nil {
				return exitStatus(1)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&lang, "lang", "l", "", "language: python (default), javascript, bash")
	f.StringVar(&context, "context", "", "context id (from the API's POST .../code/contexts); not with --lang")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for this cell (repeatable)")
	f.DurationVar(&timeout, "timeout", 0, "interrupt the cell after this long (default 5m)")
	f.StringVar(&pngDir, "png-dir", "", "save PNG results (matplotlib figures) in this directory as result-N.png")
	return cmd
}
