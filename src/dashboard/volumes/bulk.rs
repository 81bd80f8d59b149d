//! Actions on the volumes selected in the table. Each is the single
//! volume's API call made once for each of them, one after another (by
//! `app.js`), so each meets every guard it would alone (a delete is
//! refused for an attached volume, say); the dialog then lists how each
//! went. Only actions the person may do are offered, and none at all,
//! nor the boxes to select with, to one who may do none.

use maud::{Markup, html};

use crate::api::ApiState;
use crate::api::auth::{Access, Caller};

/// Which bulk actions the viewer may take (on every volume: a right to
/// some volumes by name offers none here).
pub struct Allowed {
    detach: bool,
    delete: bool,
    snapshot: bool,
    back_up: bool,
}

impl Allowed {
    pub async fn for_viewer(state: &ApiState, caller: &Caller) -> Self {
        let may = |verb, resource| {
            let access = Access::oxhorn(verb, resource, None);
            async move { state.auth.allows(caller, &access).await }
        };
        Self {
            detach: may("patch", "volumes").await,
            delete: may("delete", "volumes").await,
            snapshot: may("create", "snapshots").await,
            back_up: may("create", "backups").await,
        }
    }

    /// Whether there is anything to select volumes for.
    pub fn any(&self) -> bool {
        self.detach || self.delete || self.snapshot || self.back_up
    }
}

/// The bar of actions on the selection, disabled until there is one.
pub fn toolbar(may: &Allowed) -> Markup {
    html! {
        div.bulk role="toolbar" aria-label="Actions on the selected volumes" {
            span #selected-count aria-live="polite" { "None selected" }
            @if may.snapshot { button type="button" data-open="bulk-snapshot" data-needs-selection disabled { "Take snapshot" } }
            @if may.back_up { button type="button" data-open="bulk-back-up" data-needs-selection disabled { "Back up" } }
            @if may.detach { button type="button" data-open="bulk-detach" data-needs-selection disabled { "Detach" } }
            @if may.delete { button.danger type="button" data-open="bulk-delete" data-needs-selection disabled { "Delete" } }
        }
    }
}

/// The dialogs the bar opens.
pub fn dialogs(may: &Allowed) -> Markup {
    html! {
        @if may.snapshot {
            (dialog("bulk-snapshot", "Take a snapshot of", "Take snapshots", "POST", "/v1/volumes/{name}/snapshots", "snapshot asked", html! {
                p.hint { "Each is named after its volume and the time." }
            }))
        }
        @if may.back_up {
            (dialog("bulk-back-up", "Back up", "Back up", "POST", "/v1/volumes/{name}/backups", "backup asked", html! {
                p.hint { "Each from a snapshot taken for it." }
                label { "Target" input data-field="target" placeholder="default" autocomplete="off"; }
            }))
        }
        @if may.detach {
            (dialog("bulk-detach", "Detach", "Detach", "POST", "/v1/volumes/{name}/detach", "detaching", html! {
                p.hint { "One Kubernetes attached for a pod is not detached: its pod would lose its disk." }
            }))
        }
        @if may.delete {
            (dialog("bulk-delete", "Delete", "Delete", "DELETE", "/v1/volumes/{name}", "deleting", html! {
                p {
                    "Their data, on every replica, is deleted; their backups are kept. "
                    "One that is attached, used by a claim or has snapshots is not deleted."
                }
                label {
                    "Type the number of volumes to delete them"
                    input data-confirm-bulk autocomplete="off" inputmode="numeric";
                }
            }))
        }
    }
}

/// A dialog `id` that makes the call `method` `path` (`{name}`: each
/// selected volume's) with its `fields`, and lists each outcome: `done`,
/// or why not.
fn dialog(
    id: &str,
    title: &str,
    verb: &str,
    method: &str,
    path: &str,
    done: &str,
    fields: Markup,
) -> Markup {
    let danger = method == "DELETE";
    html! {
        dialog id=(id) aria-labelledby=(format!("{id}-title")) {
            form data-bulk=(path) data-method=(method) data-done=(done) {
                h2 id=(format!("{id}-title")) { (title) " " span data-selection-count { "the selected volumes" } }
                ul.selection data-selection aria-label="The selected volumes" {}
                (fields)
                ol.results data-results aria-label="How each went" {}
                p.summary role="status" {}
                p.error role="alert" {}
                div.buttons {
                    button type="button" data-close { "Cancel" }
                    @if danger {
                        button.danger type="submit" disabled { (verb) }
                    } @else {
                        button.primary type="submit" { (verb) }
                    }
                }
            }
        }
    }
}
