package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// FanOut drives several backends (typically one per IP family) as one. Each
// is synced even when another fails; the errors are joined.
type FanOut []Backend

// Sync syncs every backend.
func (f FanOut) Sync(ctx context.Context, snap *Snapshot, ch Changes) error {
	var errs []error
	for _, b := range f {
		if err := b.Sync(ctx, snap, ch); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DryRun renders every backend that can render itself.
func (f FanOut) DryRun(w io.Writer, snap *Snapshot) error {
	for _, b := range f {
		d, ok := b.(DryRunner)
		if !ok {
			return fmt.Errorf("backend %T cannot render a dry run", b)
		}
		if err := d.DryRun(w, snap); err != nil {
			return err
		}
	}
	return nil
}
