//! Importing a root filesystem tarball as an image through the Engine API (what `docker
//! import` does, without the CLI), with labels saying what went into it.

use iblab_sys::fs::PathError;
use std::collections::BTreeMap;
use std::path::Path;

use bollard::Docker;
use bollard::query_parameters::CreateImageOptions;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;

use super::ImageError;

/// PATH inside lab containers (an imported rootfs has no environment of its own).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `repo:tag` → (repo, tag); a reference without a tag gets `latest`.
pub fn split_reference(reference: &str) -> (String, String) {
    match reference.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo.to_string(), tag.to_string()),
        _ => (reference.to_string(), "latest".to_string()),
    }
}

/// A Dockerfile `LABEL` instruction (values quoted, `"` and `\` escaped).
fn label_instruction(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("LABEL {}", pairs.join(" "))
}

/// Stream the tarball into the engine as image `reference`; returns the image id.
pub async fn import(
    docker: &Docker,
    tarball: &Path,
    reference: &str,
    labels: &BTreeMap<String, String>,
) -> Result<String, ImageError> {
    let file = tokio::fs::File::open(tarball)
        .await
        .map_err(PathError::of("read", tarball))?;
    let chunks = futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; 1 << 20];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<Bytes, std::io::Error>(Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let (repo, tag) = split_reference(reference);
    let options = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(repo),
        tag: Some(tag),
        message: Some("iblab image build".into()),
        changes: vec![
            label_instruction(labels),
            format!("ENV PATH={PATH}"),
            "CMD [\"sleep\", \"infinity\"]".into(),
        ],
        ..Default::default()
    };
    let mut progress =
        docker.create_image(Some(options), Some(bollard::body_try_stream(chunks)), None);
    while let Some(item) = progress.next().await {
        item.map_err(ImageError::Import)?;
    }
    let image = docker.inspect_image(reference).await.map_err(|source| {
        ImageError::NotFoundAfterImport {
            reference: reference.to_string(),
            source,
        }
    })?;
    Ok(image.id.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        assert_eq!(
            split_reference("iblab/lab:0.1.0"),
            ("iblab/lab".into(), "0.1.0".into())
        );
        assert_eq!(
            split_reference("localhost:5000/lab"),
            ("localhost:5000/lab".into(), "latest".into())
        );
    }

    #[test]
    fn labels_are_quoted() {
        let l = BTreeMap::from([
            ("a.b".to_string(), "x,y z".to_string()),
            ("q".to_string(), "say \"hi\"".to_string()),
        ]);
        assert_eq!(
            label_instruction(&l),
            "LABEL a.b=\"x,y z\" q=\"say \\\"hi\\\"\""
        );
    }
}
