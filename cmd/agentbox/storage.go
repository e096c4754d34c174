package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, infoCmd, gcCmd) }

func infoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Describe the daemon: version, backend, storage driver, disk quota method, sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.Info(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), info)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "Version:\t%s (API %s)\n", info.Version, info.API)
			fmt.Fprintf(tw, "Backend:\t%s (cgroup %s)\n", info.Backend, info.CgroupMode)
			fmt.Fprintf(tw, "Capabilities:\t%v\n", info.Capabilities)
			for _, b := range info.Backends {
				if b.Unavailable != "" {
					fmt.Fprintf(tw, "Runtime %s:\tunavailable: %s\n", b.Name, b.Unavailable)
					continue
				}
				def := ""
				if b.Default {
					def = ", default"
				}
				fmt.Fprintf(tw, "Runtime %s:\t%v (cgroup %s%s)\n", b.Name, b.Capabilities, b.CgroupMode, def)
				for _, k := range slices.Sorted(maps.Keys(b.Details)) {
					fmt.Fprintf(tw, "  %s:\t%s\n", k, b.Details[k])
				}
			}
			fmt.Fprintf(tw, "Storage driver:\t%s\n", info.StorageDriver)
			dq := info.DiskQuota
			if dq == "" {
				dq = "unavailable"
			}
			fmt.Fprintf(tw, "Disk quota:\t%s\n", dq)
			fmt.Fprintf(tw, "Default disk:\t%s\n", diskLimitText(info.DefaultDiskBytes, info.DefaultDiskInodes, "none (turned off by the daemon's config)"))
			fmt.Fprintf(tw, "Max disk (tenants):\t%s\n", diskLimitText(info.MaxDiskBytes, info.MaxDiskInodes, "no ceiling"))
			fmt.Fprintf(tw, "Data dir:\t%s\n", info.DataDir)
			fmt.Fprintf(tw, "Sandboxes:\t%d\n", info.Sandboxes)
			return tw.Flush()
		},
	}
}

func gcCmd() *cobra.Command {
	var minAge time.Duration
	cmd := &cobra.Command{
		Use:   "gc [--min-age DURATION]",
		Short: "Remove layers no template, checkpoint or sandbox uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.CollectGarbage(cmd.Context(), minAge)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d layers, freed %d bytes, %d layers left\n", res.RemovedLayers, res.FreedBytes, res.Layers)
			return nil
		},
	}
	cmd.Flags().DurationVar(&minAge, "min-age", 10*time.Minute, "spare layers created or used more recently (layers of a build in progress)")
	return cmd
}

// exportTo copies an image archive to the file out, or to stdout unless it
// is a terminal.
func exportTo(cmd *cobra.Command, rc io.ReadCloser, out string) error {
	defer rc.Close()
	if out == "" || out == "-" {
		if f, ok := cmd.OutOrStdout().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			return fmt.Errorf("refusing to write an image archive to a terminal: redirect stdout or use -o FILE")
		}
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		os.Remove(out)
		return err
	}
	return f.Close()
}

func templateExportCmd(_ *globals) *cobra.Command {
	return exportCmd("export NAME [-o FILE] (> image.tar)", "Export a template as an OCI image archive", (*agentbox.Client).ExportTemplate)
}

// exportCmd is an export verb: the archive export returns for its one
// argument goes to stdout or to -o FILE.
func exportCmd(use, short string, export func(*agentbox.Client, context.Context, string) (io.ReadCloser, error)) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := rootGlobals(cmd).client()
			if err != nil {
				return err
			}
			rc, err := export(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return exportTo(cmd, rc, out)
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of stdout")
	return cmd
}

func templateImportCmd(_ *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "import NAME IMAGE.tar|OCI-LAYOUT-DIR|-",
		Short: "Create or replace a template from an OCI image archive, OCI layout dir or docker save archive",
		Long: "IMAGE.tar (or - for stdin) is streamed to the daemon; a directory is an OCI image layout\n" +
			"on the daemon's host (the same machine when talking over the unix socket).",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			name, src := args[0], args[1]
			var in io.Reader = cmd.InOrStdin()
			if src != "-" {
				fi, err := os.Stat(src)
				if err != nil {
					return err
				}
				if fi.IsDir() {
					abs, err := filepath.Abs(src)
					if err != nil {
						return err
					}
					t, err := c.ImportTemplateDir(cmd.Context(), name, abs)
					if err != nil {
						return err
					}
					return printTemplate(cmd, g, t.Name, t.ID, t.SizeBytes, t)
				}
				f, err := os.Open(src)
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			t, err := c.ImportTemplate(cmd.Context(), name, in)
			if err != nil {
				return err
			}
			return printTemplate(cmd, g, t.Name, t.ID, t.SizeBytes, t)
		},
	}
}

func printTemplate(cmd *cobra.Command, g *globals, name, id string, size int64, v any) error {
	if g.json {
		return printJSON(cmd.OutOrStdout(), v)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "imported template %s (%s, %d bytes)\n", name, id, size)
	return nil
}

func checkpointExportCmd() *cobra.Command {
	return exportCmd("export CHECKPOINT [-o FILE] (> image.tar)", "Export a checkpoint's filesystem as an OCI image archive", (*agentbox.Client).ExportCheckpoint)
}

// diskLimitText shows a disk limit of info ("10.0 GiB, 524288 inodes").
func diskLimitText(bytes, inodes int64, none string) string {
	if bytes == 0 {
		return none
	}
	if inodes == 0 {
		return humanBytes(bytes)
	}
	return fmt.Sprintf("%s, %d inodes", humanBytes(bytes), inodes)
}
