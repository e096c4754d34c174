package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// The shapes most client verbs share: a list printed as JSON or as a table
// (listing), one object printed as JSON or as one line (printResult), and a
// removal applied to each of several ids (removeCommand). All of them read
// the persistent flags through rootGlobals.

// listing is a verb that fetches a list and prints it: with --json as one
// JSON document, otherwise as a table with a header line and one row per
// item.
type listing[T any] struct {
	// fetch gets the items; args are the command's positional arguments.
	fetch func(ctx context.Context, c *agentbox.Client, args []string) ([]T, error)
	// doc wraps the items for --json, e.g. in api.TenantList; nil prints
	// the bare array. It never gets nil: an empty list prints as [], not
	// null.
	doc func(items []T) any
	// header is the table's first line: the column names, tab-separated.
	header string
	// row renders one item as tab-separated cells, without a newline.
	row func(item T) string
	// pad is the number of spaces between columns; 0 means 3.
	pad int
}

// run is the cobra RunE of a listing.
func (l listing[T]) run(cmd *cobra.Command, args []string) error {
	g := rootGlobals(cmd)
	c, err := g.client()
	if err != nil {
		return err
	}
	items, err := l.fetch(cmd.Context(), c, args)
	if err != nil {
		return err
	}
	if g.json {
		if items == nil {
			items = []T{}
		}
		var doc any = items
		if l.doc != nil {
			doc = l.doc(items)
		}
		return printJSON(cmd.OutOrStdout(), doc)
	}
	return l.table(cmd.OutOrStdout(), items)
}

// table prints items as an aligned table.
func (l listing[T]) table(w io.Writer, items []T) error {
	pad := l.pad
	if pad == 0 {
		pad = 3
	}
	tw := tabwriter.NewWriter(w, 0, 4, pad, ' ', 0)
	fmt.Fprintln(tw, l.header)
	for _, item := range items {
		fmt.Fprintln(tw, l.row(item))
	}
	return tw.Flush()
}

// noArgs adapts a list method that takes no arguments, such as
// (*agentbox.Client).Tenants, to listing.fetch.
func noArgs[T any](list func(*agentbox.Client, context.Context) ([]T, error)) func(context.Context, *agentbox.Client, []string) ([]T, error) {
	return func(ctx context.Context, c *agentbox.Client, _ []string) ([]T, error) { return list(c, ctx) }
}

// lsCommand builds the usual `ls` verb (alias list, no arguments) of l.
func lsCommand[T any](short string, l listing[T]) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   short,
		Args:    cobra.NoArgs,
		RunE:    l.run,
	}
}

// printResult prints what a verb that creates or changes one object
// returns: v as JSON with --json (asJSON), otherwise line (an id, a name, a
// short sentence) and a newline.
func printResult(cmd *cobra.Command, asJSON bool, v any, line string) error {
	if asJSON {
		return printJSON(cmd.OutOrStdout(), v)
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), line)
	return err
}

// removeOutput is what a verb built by removeCommand prints.
type removeOutput int

const (
	// removeQuiet prints nothing on success; the failures are returned
	// joined.
	removeQuiet removeOutput = iota
	// removeEcho prints each id removed on its own line, and reports every
	// failure on its own line with its request id, as agentbox rm does.
	removeEcho
)

// removeCommand builds the verb use (e.g. "rm ID...", alias delete), which
// calls del for each id it is given, one at a time, going on past failures.
// del is usually a method expression such as (*agentbox.Client).DeleteTenant.
func removeCommand(use, short string, out removeOutput, del func(*agentbox.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Aliases: []string{"delete"},
		Short:   short,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := rootGlobals(cmd).client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range ids {
				if err := del(c, cmd.Context(), id); err != nil {
					errs = append(errs, err)
					continue
				}
				if out == removeEcho {
					fmt.Fprintln(cmd.OutOrStdout(), id)
				}
			}
			if out == removeEcho {
				return reportAll(cmd, errs)
			}
			return errors.Join(errs...)
		},
	}
}
