//! Printing outcomes: `{"results": [...]}` as JSON or YAML for programs, an
//! aligned table for people.

use std::io::Write;

use serde::Serialize;

use super::outcome::ClaimOutcome;

/// Outcomes that could not be written: the writer's or the encoder's own
/// error, shown as it is.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(transparent)]
    Write(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
}

#[derive(Debug, Serialize)]
struct Document<'a> {
    results: &'a [ClaimOutcome],
}

pub fn json(out: &mut impl Write, outcomes: &[ClaimOutcome]) -> Result<(), OutputError> {
    serde_json::to_writer_pretty(&mut *out, &Document { results: outcomes })?;
    writeln!(out)?;
    Ok(())
}

pub fn yaml(out: &mut impl Write, outcomes: &[ClaimOutcome]) -> Result<(), OutputError> {
    out.write_all(serde_yaml_ng::to_string(&Document { results: outcomes })?.as_bytes())?;
    Ok(())
}

/// `request=dev,dev request2=dev`: results grouped by request, the pool
/// shown when it is not the node's own.
fn devices(o: &ClaimOutcome) -> String {
    let Some(a) = &o.allocation else { return "-".to_string() };
    let results = a.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default();
    if results.is_empty() {
        return "(none)".to_string();
    }
    let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
    for r in results {
        let mut device = if o.node.as_deref() == Some(r.pool.as_str()) {
            r.device.clone()
        } else {
            format!("{}/{}", r.pool, r.device)
        };
        // A share of a device: what it takes (zero amounts left out).
        let taken: Vec<String> = r
            .consumed_capacity
            .iter()
            .flatten()
            .filter(|(_, q)| q.0 != "0")
            .map(|(name, q)| format!("{name}={}", q.0))
            .collect();
        if !taken.is_empty() {
            device.push_str(&format!("[{}]", taken.join(",")));
        }
        match groups.last_mut() {
            Some((request, list)) if *request == r.request.as_str() => list.push(device),
            _ => groups.push((r.request.as_str(), vec![device])),
        }
    }
    groups.iter().map(|(request, list)| format!("{request}={}", list.join(","))).collect::<Vec<_>>().join(" ")
}

/// Writes `n` spaces.
fn spaces(out: &mut impl Write, mut n: usize) -> std::io::Result<()> {
    const BLANK: &[u8] = &[b' '; 64];
    while n > 0 {
        let chunk = n.min(BLANK.len());
        out.write_all(&BLANK[..chunk])?;
        n -= chunk;
    }
    Ok(())
}

/// The POD cell: the pod's name, and the kind and name of its workload.
fn pod_cell(c: &ClaimOutcome) -> String {
    let name = |key: &str| key.split_once('/').map_or(key, |(_, n)| n).to_string();
    match (c.pod.as_deref(), c.workload.as_deref()) {
        (None, _) => "-".to_string(),
        (Some(pod), None) => name(pod),
        (Some(pod), Some(workload)) => {
            let (kind, key) = workload.split_once(' ').unwrap_or(("", workload));
            format!("{} ({kind} {})", name(pod), name(key))
        }
    }
}

/// Aligned columns NAMESPACE/NAME, POD, NODE, DEVICES, REASON, then a summary.
pub fn table(out: &mut impl Write, outcomes: &[ClaimOutcome]) -> Result<(), OutputError> {
    let mut rows = vec![["NAMESPACE/NAME".to_string(), "POD".into(), "NODE".into(), "DEVICES".into(), "REASON".into()]];
    for o in outcomes {
        let reason = match (&o.reason, o.error) {
            (None, _) => "-".to_string(),
            (Some(r), true) => format!("error: {r}"),
            (Some(r), false) => r.clone(),
        };
        rows.push([o.key.clone(), pod_cell(o), o.node.clone().unwrap_or_else(|| "-".into()), devices(o), reason]);
    }
    let width = |col: usize| rows.iter().map(|r| r.get(col).map_or(0, |s| s.chars().count())).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2), width(3)];
    for [name, pod, node, devices, reason] in &rows {
        // Padded by hand: `{:<w$}` panics for widths past u16::MAX, and a
        // cell (a long reason, hundreds of devices) can be that wide.
        for (cell, width) in [name, pod, node, devices].into_iter().zip(widths) {
            out.write_all(cell.as_bytes())?;
            spaces(out, width.saturating_sub(cell.chars().count()) + 2)?;
        }
        writeln!(out, "{reason}")?;
    }
    let allocated = outcomes.iter().filter(|o| o.allocated).count();
    let errors = outcomes.iter().filter(|o| o.error).count();
    write!(out, "\n{allocated} of {} claims allocated", outcomes.len())?;
    if errors > 0 {
        write!(out, "; {errors} with errors")?;
    }
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_wider_than_u16_print_aligned() {
        let long = "n".repeat(70_000);
        let refused =
            |key: &str| ClaimOutcome { key: key.to_string(), reason: Some("r".repeat(66_000)), ..Default::default() };
        let outcomes = [refused(&long), refused("ns/short")];
        let mut out = Vec::new();
        table(&mut out, &outcomes).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let node = lines[0].find("NODE").unwrap();
        assert_eq!(node, 70_002 + "POD".len() + 2);
        assert_eq!(lines[2].get(node..node + 1), Some("-"), "the short row's node column lines up");
        assert!(lines[1].ends_with(&"r".repeat(66_000)));
        assert_eq!(lines.last().copied(), Some("0 of 2 claims allocated"));
    }
}
