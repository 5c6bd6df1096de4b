-- The notebook edition's pandoc filter: the book's own numbering, applied to the parsed source.
--
-- longctx.booktools.html numbers the whole book once (numbering.py) and names, in the
-- metadata field `longctx-targets`, a JSON file holding every label's reference text,
-- number and page, and the book's pages; `longctx-page` is the page being rendered.
-- The filter runs before citeproc, so a label never reaches citeproc as a citation. It
--   - turns `@fig-x`, `[@fig-x]`, `-@fig-x` and `[Fig. @fig-x]` into links that read as
--     the Quarto edition's do ("Figure 3.2", "3.2", "Fig. 3.2");
--   - puts a heading's section number (attribute `number`, written by the build) before it;
--   - tags a labelled display equation, `$$ ... $$ {#eq-x}`, with its number and its id;
--   - captions labelled tables (`: Caption {#tbl-x}`) and the figure and table divs the
--     build puts around a cell's outputs ("Figure 3.2: ...");
--   - renders callouts, a collapsed one as a closed <details>;
--   - sends links to `.qmd` and `.ipynb` files to their pages, and `#label` to its page;
--   - ends a page that cites anything with a References section, which citeproc fills.

local NBSP = "\u{a0}"
local CALLOUT_TITLES = { note = "Note", tip = "Tip", warning = "Warning", important = "Important", caution = "Caution" }

local targets, pages, page = {}, {}, ""

local function read_targets(meta)
  local path = pandoc.utils.stringify(meta["longctx-targets"] or "")
  if path ~= "" then
    local handle = assert(io.open(path, "r"))
    local data = pandoc.json.decode(handle:read("a"), false)
    handle:close()
    targets = data.targets
    for _, stem in ipairs(data.pages) do pages[stem] = true end
  end
  page = pandoc.utils.stringify(meta["longctx-page"] or "")
end

-- A link on its own page keeps only its fragment.
local function local_href(href)
  local prefix = page .. "#"
  if page ~= "" and href:sub(1, #prefix) == prefix then return href:sub(#page + 1) end
  return href
end

local function is_label(id)
  return id:match("^fig%-") or id:match("^tbl%-") or id:match("^eq%-") or id:match("^sec%-")
end

-- "Figure 3.2: " before a caption's first line.
local function prefix_caption(blocks, text)
  local first = blocks[1]
  if first and (first.t == "Plain" or first.t == "Para") then
    first.content:insert(1, pandoc.Space())
    first.content:insert(1, pandoc.Str(text .. ":"))
  else
    blocks:insert(1, pandoc.Plain { pandoc.Str(text) })
  end
end

-- Callouts and the figure and table divs around cell outputs (before the inlines are linked,
-- so a callout title given as an attribute is read as markdown and linked too).
local function callout(div, kind)
  local blocks = div.content
  local title
  if div.attributes.title then
    local parsed = pandoc.read(div.attributes.title, "markdown").blocks
    title = parsed[1] and parsed[1].content or pandoc.Inlines {}
  elseif blocks[1] and blocks[1].t == "Header" then
    title = blocks[1].content
    blocks:remove(1)
  else
    title = pandoc.Inlines(CALLOUT_TITLES[kind] or kind)
  end
  local class = "callout callout-" .. kind
  local open, middle, close
  if div.attributes.collapse == "true" then
    open = '<details class="' .. class .. '"><summary class="callout-title">'
    middle, close = '</summary><div class="callout-body">', "</div></details>"
  else
    open = '<div class="' .. class .. '"><p class="callout-title">'
    middle, close = '</p><div class="callout-body">', "</div></div>"
  end
  local result = pandoc.Blocks { pandoc.RawBlock("html", open), pandoc.Plain(title), pandoc.RawBlock("html", middle) }
  result:extend(blocks)
  result:insert(pandoc.RawBlock("html", close))
  return result
end

local function float(div, kind)
  local caption, content = pandoc.Blocks {}, pandoc.Blocks {}
  for _, block in ipairs(div.content) do
    if block.t == "Div" and block.classes:includes("float-caption") then
      caption = block.content
    else
      content:insert(block)
    end
  end
  local target = targets[div.identifier]
  if target and target.number ~= "" then prefix_caption(caption, target.text) end
  if kind == "table" then
    for _, block in ipairs(content) do
      if block.t == "Table" then
        block.identifier = div.identifier
        block.caption = { long = caption }
        return content
      end
    end
  end
  return pandoc.Figure(content, { long = caption }, pandoc.Attr(div.identifier, { "figure" }))
end

local function Div(div)
  for _, class in ipairs(div.classes) do
    local kind = class:match("^callout%-(.+)$")
    if kind then return callout(div, kind) end
    if class == "float-figure" then return float(div, "figure") end
    if class == "float-table" then return float(div, "table") end
  end
end

-- Cross-references, section numbers, equations, captions, links.
-- A cite may mix labels and bibliography keys (`@fig-x [see @key]` is one to pandoc): the
-- labels become links, the rest stays a citation for citeproc.
local function Cite(cite)
  local result, rest = pandoc.Inlines {}, {}
  for _, citation in ipairs(cite.citations) do
    local target = is_label(citation.id) and targets[citation.id]
    if target then
      local number = target.number ~= "" and target.number or target.text
      local text
      if citation.mode == "SuppressAuthor" then
        text = pandoc.Inlines(number)
      elseif #citation.prefix > 0 then
        text = citation.prefix:clone()
        text:insert(pandoc.Str(NBSP .. number))
      else
        text = pandoc.Inlines(target.text)
      end
      if #result > 0 then result:extend { pandoc.Str(","), pandoc.Space() } end
      result:insert(pandoc.Link(text, local_href(target.href), "", pandoc.Attr("", { "crossref" })))
      result:extend(citation.suffix)
    else
      table.insert(rest, citation)
    end
  end
  if #rest == #cite.citations then return nil end
  if #rest > 0 then result:extend { pandoc.Space(), pandoc.Cite({}, rest) } end
  return result
end

local function Header(header)
  local number = header.attributes.number
  if number then
    header.attributes.number = nil
    header.attributes["data-number"] = number
    header.content:insert(1, pandoc.Space())
    header.content:insert(1, pandoc.Span(pandoc.Inlines(number), pandoc.Attr("", { "header-section-number" })))
  end
  return header
end

local function is_space(inline)
  return inline and (inline.t == "Space" or inline.t == "SoftBreak")
end

local function Inlines(inlines)
  for index = #inlines, 1, -1 do
    local math = inlines[index]
    if math.t == "Math" and math.mathtype == "DisplayMath" then
      local after = index + 1
      while is_space(inlines[after]) do after = after + 1 end
      local attribute = inlines[after]
      local label = attribute and attribute.t == "Str" and attribute.text:match("^{#(eq%-[^}%s]+)}$")
      local target = label and targets[label]
      if target then
        local tagged = pandoc.Math("DisplayMath", math.text .. "\\tag{" .. target.number .. "}")
        inlines[index] = pandoc.Span({ tagged }, pandoc.Attr(label))
        for _ = index + 1, after do inlines:remove(index + 1) end
      end
    end
  end
  return inlines
end

local function Table(tbl)
  local blocks = tbl.caption.long
  local last = blocks[#blocks]
  if last and (last.t == "Plain" or last.t == "Para") then
    local content = last.content
    local final = content[#content]
    local label = final and final.t == "Str" and final.text:match("^{#(tbl%-[^}%s]+)}$")
    if label then
      content:remove(#content)
      while is_space(content[#content]) do content:remove(#content) end
      tbl.identifier = label
      if targets[label] then prefix_caption(blocks, targets[label].text) end
      tbl.caption = { long = blocks }
    end
  end
  return pandoc.Div({ tbl }, pandoc.Attr("", { "table-scroll" }))
end

-- A labelled image in the source, `![Caption](file.png){#fig-x fig-alt="..."}`.
local function Figure(figure)
  if figure.classes:includes("figure") then return nil end
  local target = targets[figure.identifier]
  if not target then return nil end
  prefix_caption(figure.caption.long, target.text)
  figure.classes:insert("figure")
  return figure:walk {
    Image = function(image)
      local alt = image.attributes["fig-alt"]
      if alt then
        image.attributes["fig-alt"] = nil
        image.caption = pandoc.Inlines(alt)
      end
      return image
    end,
  }
end

local function Link(link)
  if link.classes:includes("crossref") or link.target:match("^%a[%w+.-]*:") or link.target:match("^//") then
    return nil
  end
  local path, fragment = link.target:match("^([^#]*)(.*)$")
  if path == "" then
    local target = targets[fragment:sub(2)]
    if target then link.target = local_href(target.href) end
  else
    local stem = path:match("([^/]+)%.qmd$") or path:match("([^/]+)%.ipynb$")
    if stem and pages[stem] then link.target = stem .. ".html" .. fragment end
  end
  return link
end

-- After the links: any citation left is one for citeproc, which fills `#refs`.
local function References(doc)
  local cites = false
  doc.blocks:walk { Cite = function() cites = true end }
  if cites then
    doc.blocks:insert(pandoc.Header(2, "References", pandoc.Attr("references", { "unnumbered" })))
    doc.blocks:insert(pandoc.Div({}, pandoc.Attr("refs")))
  end
  return doc
end

return {
  { Meta = read_targets },
  { Div = Div },
  { Cite = Cite, Header = Header, Inlines = Inlines, Table = Table, Figure = Figure, Link = Link },
  { Pandoc = References },
}
