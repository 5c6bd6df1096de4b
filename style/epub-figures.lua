-- EPUB only: Quarto 1.7 copies a figure cell's `fig-alt` onto the figure's outer <div> as an
-- `alt` attribute, which XHTML does not allow (EPUBCheck: RSC-005). The image keeps its alt text.
function Div(div)
  if quarto.doc.is_format("epub") and div.attributes["alt"] ~= nil then
    div.attributes["alt"] = nil
    return div
  end
end
