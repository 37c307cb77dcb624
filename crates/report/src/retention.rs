//! Throughput retention as the labs define it: a measurement taken while a fault acts on a
//! link, divided by what the path could have had: its own throughput measured earlier
//! with no fault in place (the baseline), or the bottleneck's rate if that is lower.
//! A measurement with no fault in place, or with no clean one before it, has no retention.

use serde::Serialize;

use iblab_core::evidence::{Evidence, StepRecord, Verdict};
use iblab_lab::names;
use iblab_lab::{PathKind, StepKind};

/// The retention of one faulted measurement, with what it was computed from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Retention {
    /// congested / reference.
    pub share: f64,
    /// The clean measurement of the same path (step id, Mbit/s).
    pub baseline_step: String,
    pub baseline_mbps: f64,
    /// The lowest rate a fault capped a link to at the time, when lower than the baseline.
    pub cap_mbps: Option<f64>,
}

impl Retention {
    /// What the share is of, in words: `of min(clean 130 Mbit/s, bottleneck 20 Mbit/s)`.
    pub fn of(&self) -> String {
        self.of_in(iblab_lab::Lang::En)
    }

    /// [`Retention::of`] in `lang`.
    pub fn of_in(&self, lang: iblab_lab::Lang) -> String {
        let base = format!(
            "{} {} Mbit/s",
            self.baseline_step,
            crate::terminal::fmt_num(self.baseline_mbps)
        );
        match self.cap_mbps {
            Some(c) => rust_i18n::t!(
                "retention.of_min",
                locale = lang.tag(),
                base = base,
                cap = crate::terminal::fmt_num(c)
            )
            .into_owned(),
            None => rust_i18n::t!("retention.of", locale = lang.tag(), base = base).into_owned(),
        }
    }
}

/// Retention per traffic step and path, in the evidence's step order: `(step id, path)` →
/// retention, for every measurement that has one.
pub fn all(e: &Evidence) -> Vec<((String, PathKind), Retention)> {
    // Faults in place, by link: the rate (Mbit/s) a `rate` fault capped it to, if any.
    let mut active: std::collections::BTreeMap<String, Option<f64>> = Default::default();
    let mut baseline: std::collections::BTreeMap<PathKind, (String, f64)> = Default::default();
    let mut out = Vec::new();
    for s in &e.steps {
        if s.kind == StepKind::Fault {
            fault(&mut active, s);
            continue;
        }
        let (Some(p), Some(m)) = (s.path, s.metrics.get(names::THROUGHPUT_MBPS)) else {
            continue;
        };
        if s.kind != StepKind::Traffic {
            continue;
        }
        if active.is_empty() {
            if s.verdict == Verdict::Pass && m.value > 0.0 {
                baseline.insert(p, (s.id.clone(), m.value));
            }
            continue;
        }
        let Some((base_id, base)) = baseline.get(&p) else {
            continue;
        };
        let cap = active
            .values()
            .flatten()
            .copied()
            .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.min(r))))
            .filter(|c| *c < *base);
        let reference = cap.unwrap_or(*base);
        out.push((
            (s.id.clone(), p),
            Retention {
                share: m.value / reference,
                baseline_step: base_id.clone(),
                baseline_mbps: *base,
                cap_mbps: cap,
            },
        ));
    }
    out
}

/// The retention of one measurement, if it has one.
pub fn of(e: &Evidence, step: &str, path: PathKind) -> Option<Retention> {
    all(e)
        .into_iter()
        .find(|((id, p), _)| id == step && *p == path)
        .map(|(_, r)| r)
}

/// Follow what a fault step did to its link: `clear` and `up` end what acts on it; any
/// other action that passed puts a fault in place (`rate` with its rate).
fn fault(active: &mut std::collections::BTreeMap<String, Option<f64>>, s: &StepRecord) {
    let Some(done) = s.fault_done() else {
        return;
    };
    match done.action.as_deref() {
        Some("clear") | Some("up") => {
            active.remove(&done.link);
        }
        Some("count") | None => {}
        Some(_) if s.verdict == Verdict::Pass => {
            let rate = done.rate_bps.map(|b| b / 1e6);
            let entry = active.entry(done.link).or_insert(None);
            if rate.is_some() {
                *entry = rate;
            }
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::evidence::Metric;

    fn fixture() -> Evidence {
        iblab_core::testdata::evidence(iblab_core::testdata::TCP_LOSS)
    }

    /// tcp-loss: the lossy measurement over the clean one, the clean one has none.
    #[test]
    fn a_faulted_measurement_over_the_clean_one() {
        let e = fixture();
        let all = all(&e);
        assert_eq!(all.len(), 1, "{all:?}");
        let ((id, p), r) = &all[0];
        assert_eq!((id.as_str(), *p), ("lossy", PathKind::Tcp));
        assert_eq!(r.baseline_step, "clean");
        assert_eq!(r.cap_mbps, None);
        assert!(r.share > 0.0 && r.share < 1.0, "{r:?}");
        assert!(of(&e, "clean", PathKind::Tcp).is_none());
    }

    /// Lesson 5's definition: congested over min(clean, the bottleneck's rate).
    #[test]
    fn a_bottleneck_caps_the_reference() {
        let mut e = fixture();
        let loss_on = e.steps.iter_mut().find(|s| s.id == "loss_on").unwrap();
        loss_on.detail["action"] = "rate".into();
        loss_on.detail["rate_bps"] = 20_000_000.0.into();
        let clean = e.steps.iter_mut().find(|s| s.id == "clean").unwrap();
        clean
            .metrics
            .insert(names::THROUGHPUT_MBPS.into(), Metric::new(130.0, "Mbit/s"));
        let lossy = e.steps.iter_mut().find(|s| s.id == "lossy").unwrap();
        lossy
            .metrics
            .insert(names::THROUGHPUT_MBPS.into(), Metric::new(19.0, "Mbit/s"));
        let r = of(&e, "lossy", PathKind::Tcp).unwrap();
        assert!((r.share - 0.95).abs() < 1e-9, "{r:?}");
        assert_eq!(r.cap_mbps, Some(20.0));
        assert_eq!(r.of(), "of min(clean 130 Mbit/s, bottleneck 20 Mbit/s)");
    }

    /// Without a clean measurement before it there is no baseline, so no retention.
    #[test]
    fn no_baseline_no_retention() {
        let mut e = fixture();
        e.steps.retain(|s| s.id != "clean");
        assert!(all(&e).is_empty());
    }

    /// A captured lesson 5 run: retention by the lab's own definition, so TCP and IB keep
    /// most of the bottleneck's 20 Mbit/s and RoCE collapses, whatever their clean rates
    /// (the first measurement of a path is not the reference: IB's clean 44 Mbit/s is).
    #[test]
    fn lesson5_reads_as_the_lesson_says() {
        let e: Evidence = iblab_core::testdata::evidence(iblab_core::testdata::LESSON5_CONGESTION);
        let kept = |p| of(&e, "congested", p).unwrap();
        for p in [PathKind::Tcp, PathKind::Roce, PathKind::Ib] {
            assert_eq!(kept(p).cap_mbps, Some(20.0), "{p:?}");
            assert_eq!(kept(p).baseline_step, "clean");
            assert!(
                of(&e, "clean", p).is_none(),
                "{p:?}: the clean run has no baseline"
            );
        }
        assert!(kept(PathKind::Tcp).share > 0.8, "{:?}", kept(PathKind::Tcp));
        assert!(kept(PathKind::Ib).share > 0.8, "{:?}", kept(PathKind::Ib));
        assert!(
            kept(PathKind::Roce).share < 0.1,
            "{:?}",
            kept(PathKind::Roce)
        );
        let html = crate::html::render(&e);
        assert!(
            html.contains("retained of min(clean"),
            "the chart says what it is a share of"
        );
    }
}
