//! Who uses a volume, on its page: its PersistentVolume, the claim bound
//! to that and the claim's Pods, read as `/v1/volumes/{name}/workload`
//! reads them, with the same authorization: a person who may not read
//! them is told so in place of the section's content, not refused the
//! page.

use maud::{Markup, html};

use super::layout::badge;
use crate::api::ApiError;
use crate::api::workload::WorkloadView;

pub fn section(workload: &Result<WorkloadView, ApiError>) -> Markup {
    html! {
        section.panel #workload aria-labelledby="workload-heading" {
            h2 #workload-heading { "Workload" }
            @match workload {
                Ok(workload) => (shown(workload)),
                Err(error @ ApiError::Forbidden { .. }) => {
                    p.empty data-workload="forbidden" {
                        "You are not allowed to see who uses this volume: " (error.to_string()) "."
                    }
                }
                Err(error) => p.error role="alert" { "Its workload could not be read: " (error.to_string()) }
            }
        }
    }
}

fn shown(workload: &WorkloadView) -> Markup {
    let Some(pv) = &workload.persistent_volume else {
        return html! { p.empty data-workload="none" { "No PersistentVolume uses this volume." } };
    };
    html! {
        dl.facts {
            div { dt { "PersistentVolume" } dd data-fact="pv" { (pv.name) " " (phase(&pv.phase)) } }
            div { dt { "Storage class" } dd { (or_none(&pv.storage_class)) } }
            div { dt { "Reclaim policy" } dd { (or_none(&pv.reclaim_policy)) } }
            @if let Some(claim) = &workload.claim {
                div {
                    dt { "Claim" }
                    dd data-fact="claim" { (claim.namespace) "/" (claim.name) " " (phase(&claim.phase)) }
                }
                div { dt { "Capacity" } dd { (or_none(&claim.capacity)) } }
            } @else {
                div { dt { "Claim" } dd data-fact="claim" { "none bound" } }
            }
        }
        @if let Some(claim) = &workload.claim {
            @if workload.pods.is_empty() {
                p.empty { "No pod uses " (claim.name) "." }
            } @else {
                div.scroll { table #pods {
                    thead { tr { th data-sort { "Pod" } th data-sort { "Node" } th data-sort { "Phase" } th data-sort { "Ready" } } }
                    tbody {
                        @for pod in &workload.pods {
                            tr data-pod=(pod.name) {
                                td { (claim.namespace) "/" (pod.name) }
                                td { (or_none(&pod.node)) }
                                td { (or_none(&pod.phase)) }
                                td { @if pod.ready { "yes" } @else { "no" } }
                            }
                        }
                    }
                } }
            }
        }
    }
}

/// A PersistentVolume's or claim's phase as a badge, if it has one yet.
fn phase(phase: &str) -> Markup {
    html! { @if !phase.is_empty() { (badge(&phase.to_lowercase())) } }
}

/// A value, or a muted "none" for an empty one.
fn or_none(value: &str) -> Markup {
    html! { @if value.is_empty() { span.muted { "none" } } @else { (value) } }
}
