//! The lab image: the tools every fabric needs, built on this machine from Debian packages
//! (no registry), imported through the Engine API and labelled with what went into it.

mod error;
pub mod hostcopy;
pub mod import;
pub mod operator;
pub mod recipe;
pub mod rootfs;

use std::collections::BTreeMap;
use std::time::Instant;

use bollard::Docker;

use crate::engine::{Engine, is_not_found};
pub use error::ImageError;
use recipe::Recipe;

/// Label keys on the image.
pub mod label {
    pub const VERSION: &str = "iblab.version";
    pub const VARIANT: &str = "iblab.variant";
    pub const PACKAGES: &str = "iblab.packages";
    pub const RECIPE: &str = "iblab.recipe";
    pub const CONTENT: &str = "iblab.content-hash";
    pub const SUITE: &str = "iblab.suite";
    pub const MIRROR: &str = "iblab.mirror";
    pub const MISSING: &str = "iblab.missing";
    pub const BUILT: &str = "iblab.built";
}

/// Who provides the programs of a run's nodes on the docker (and kube) homes.
pub use iblab_core::images::{LAB_PROVIDER as PROVIDER, lab_carries as carries};

use iblab_core::images::lab as reference;

/// How to make the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// debootstrap --variant=minbase with the lab packages (complete; ~1 min cold, cached).
    Debootstrap,
    /// This host's tool binaries and their ldd closure (<1 s; only what the host has).
    Host,
}

impl Variant {
    /// Every variant, for the command line.
    pub const ALL: [Variant; 2] = [Variant::Debootstrap, Variant::Host];

    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Debootstrap => "debootstrap",
            Variant::Host => "host",
        }
    }
}

/// An image that exists, with its labels.
#[derive(Debug, Clone)]
pub struct Image {
    pub reference: String,
    pub id: String,
    pub size: i64,
    pub labels: BTreeMap<String, String>,
}

impl Image {
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map(String::as_str).unwrap_or("?")
    }
    /// One line: variant, when built, short id, size.
    pub fn summary(&self) -> String {
        format!(
            "{} ({} image, built {}, {} MB, id {})",
            self.reference,
            self.label(label::VARIANT),
            self.label(label::BUILT),
            self.size / 1_000_000,
            self.id
                .trim_start_matches("sha256:")
                .get(..12)
                .unwrap_or(&self.id)
        )
    }
}

/// The image, if the engine has it.
pub async fn find(docker: &Docker, reference: &str) -> Result<Option<Image>, ImageError> {
    match docker.inspect_image(reference).await {
        Ok(i) => Ok(Some(Image {
            reference: reference.to_string(),
            id: i.id.unwrap_or_default(),
            size: i.size.unwrap_or(0),
            labels: i
                .config
                .and_then(|c| c.labels)
                .unwrap_or_default()
                .into_iter()
                .collect(),
        })),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(source) => Err(ImageError::Inspect {
            reference: reference.to_string(),
            source,
        }),
    }
}

/// What `build` should do.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub variant: Variant,
    pub suite: Option<String>,
    pub mirror: Option<String>,
    /// Make the rootfs again even when a cached one matches.
    pub rebuild: bool,
}

/// The host programs an image build starts through iblab's process layer: debootstrap and
/// tar for the Debian root filesystem, ldd and tar for a copy of this host's tools. A run
/// that builds the image on first use allows exactly these while it does
/// ([`iblab_sys::process::allowing`]); the build checks for them itself.
pub const BUILD_PROGRAMS: &[&str] = &["debootstrap", "tar", "ldd"];

/// Build and import the image; returns it and the seconds it took.
pub async fn build(
    engine: &Engine,
    opts: &BuildOptions,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(Image, f64), ImageError> {
    let t0 = Instant::now();
    let reference = reference();
    let mut labels = BTreeMap::from([
        (
            label::VERSION.to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        (
            label::VARIANT.to_string(),
            opts.variant.as_str().to_string(),
        ),
        (
            label::BUILT.to_string(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        ),
    ]);
    let (tar, temporary) = match opts.variant {
        Variant::Debootstrap => {
            let r = Recipe::for_host(opts.suite.as_deref(), opts.mirror.as_deref());
            let tar = rootfs::debootstrap(&r, opts.rebuild, say).await?;
            labels.insert(label::PACKAGES.into(), r.packages.join(","));
            labels.insert(label::RECIPE.into(), r.hash());
            labels.insert(label::SUITE.into(), r.suite.clone());
            labels.insert(label::MIRROR.into(), r.mirror.clone());
            (tar, false)
        }
        Variant::Host => {
            say("copying this host's lab tools and their libraries");
            let c = hostcopy::build().await?;
            labels.insert(label::PACKAGES.into(), c.programs.join(","));
            labels.insert(label::RECIPE.into(), c.tarball.sha256.clone());
            if !c.missing.is_empty() {
                labels.insert(label::MISSING.into(), c.missing.join(","));
            }
            (c.tarball, true)
        }
    };
    labels.insert(label::CONTENT.into(), format!("sha256:{}", tar.sha256));
    let previous = find(&engine.docker, &reference).await.ok().flatten();
    say(&format!("importing {} as {reference}", tar.path.display()));
    let imported = import::import(&engine.docker, &tar.path, &reference, &labels).await;
    if temporary {
        let _ = std::fs::remove_file(&tar.path);
    }
    imported?;
    let image = find(&engine.docker, &reference)
        .await?
        .ok_or_else(|| ImageError::MissingAfterImport(reference.clone()))?;
    // The image this one replaces would linger untagged: remove it unless a container
    // still uses it.
    if let Some(old) = previous.filter(|o| o.id != image.id) {
        let _ = engine
            .docker
            .remove_image(
                &old.id,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
    Ok((image, t0.elapsed().as_secs_f64()))
}

/// The image for a run: reused when present, built (debootstrap) on first use.
pub async fn ensure(engine: &Engine, say: &(dyn Fn(&str) + Sync)) -> Result<Image, ImageError> {
    let reference = reference();
    if let Some(img) = find(&engine.docker, &reference).await? {
        say(&format!("using lab image {}", img.summary()));
        return Ok(img);
    }
    say(&format!(
        "lab image {reference} not found: building it now from Debian packages (first use only; \
         `iblab image build` does this ahead of time)"
    ));
    let opts = BuildOptions {
        variant: Variant::Debootstrap,
        suite: None,
        mirror: None,
        rebuild: false,
    };
    let (img, secs) = iblab_sys::process::allowing(
        "building the lab image",
        BUILD_PROGRAMS,
        build(engine, &opts, say),
    )
    .await?;
    say(&format!("built lab image {} in {secs:.1}s", img.summary()));
    Ok(img)
}
